/**
 * Single flight and a bounded LRU: one fetch per identity however many requests arrive together,
 * and fresh credentials answered from memory. Past `maxEntries`, the least recently used identity
 * that is not kept goes first.
 */
import type { Credentials } from '../model/credentials.js';
import { type RoleIdentity, identityKey } from '../model/role-identity.js';
import type { CredentialSupply, Supplied, SupplyRequest } from './supply.js';

interface CacheOptions {
  /** Whether cached credentials may still be handed out as they are. */
  readonly isFresh: (credentials: Credentials) => boolean;
  /** Cached identities kept at most; unbounded when absent. */
  readonly maxEntries?: number;
  /** Identities evicted only when every other one is gone (a live pod uses them). */
  readonly keep: (key: string) => boolean;
}

interface Cached {
  readonly supply: CredentialSupply;
  /** The credentials held for an identity, fresh or not; not a use, so recency stays. */
  readonly peek: (identity: RoleIdentity) => Credentials | undefined;
  readonly forget: (identity: RoleIdentity) => void;
  readonly size: () => number;
}

interface InFlight {
  readonly answer: Promise<Supplied>;
  readonly request: SupplyRequest;
}

export function cached(inner: CredentialSupply, options: CacheOptions): Cached {
  /** Map order is recency order: a use moves the entry to the end. */
  const entries = new Map<string, Credentials>();
  const inFlight = new Map<string, InFlight>();

  const touch = (key: string): Credentials | undefined => {
    const entry = entries.get(key);
    if (entry) {
      entries.delete(key);
      entries.set(key, entry);
    }
    return entry;
  };

  /** Past the bound, drop the least recently used identity not kept, else the least recently used. */
  const enforceBound = () => {
    const max = options.maxEntries;
    if (max === undefined) return;
    while (entries.size > max) {
      let victim: string | undefined;
      for (const key of entries.keys()) {
        if (!options.keep(key)) {
          victim = key;
          break;
        }
      }
      victim ??= entries.keys().next().value as string;
      entries.delete(victim);
    }
  };

  const fetch = (key: string, identity: RoleIdentity, request: SupplyRequest): Promise<Supplied> => {
    const pending = inFlight.get(key);
    if (pending) {
      if (request.priority === 'client') pending.request.priority = 'client';
      return pending.answer;
    }
    const answer = inner(identity, request)
      .then((supplied) => {
        entries.delete(key);
        entries.set(key, supplied.credentials);
        enforceBound();
        return supplied;
      })
      .finally(() => inFlight.delete(key));
    // A fetch nobody awaits any more (the client's deadline passed) must not be an unhandled rejection.
    answer.catch(() => undefined);
    inFlight.set(key, { answer, request });
    return answer;
  };

  return {
    supply: async (identity, request) => {
      const key = identityKey(identity);
      if (!request.renew) {
        const entry = touch(key);
        if (entry && options.isFresh(entry)) return { credentials: entry, freshness: 'hit' };
      }
      return fetch(key, identity, request);
    },
    peek: (identity) => entries.get(identityKey(identity)),
    forget: (identity) => void entries.delete(identityKey(identity)),
    size: () => entries.size,
  };
}
