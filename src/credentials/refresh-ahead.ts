/**
 * Refresh ahead: identities a live pod uses are tracked, fetched as soon as the pod appears (or at
 * its first request, with first-use prefetch) and renewed before they would stop being handed out, with jitter so refreshes spread out. A failed
 * refresh tries again later, backing off.
 */
import { fullJitterMs } from '../backoff.js';
import type { Credentials } from '../model/credentials.js';
import { type RoleIdentity, identityKey } from '../model/role-identity.js';
import { refreshDelayMs } from './lifetimes.js';
import type { CredentialSupply } from './supply.js';

/** After a refresh gave up, a tracked identity tries again this much later (doubling, capped). */
const REFRESH_RETRY = { initialMs: 10_000, maxMs: 5 * 60_000 } as const;

/**
 * When a tracked identity is first fetched: on arrival (track fetches it at once) or on first use
 * (the first request fetches it; from then on it is refreshed ahead like any tracked one).
 */
export type Prefetch = 'arrival' | 'first-use';

interface RefreshAheadOptions {
  /** Arrival when absent. */
  readonly prefetch?: Prefetch;
  /** What the layer below holds for an identity, and a way to drop it when the last user goes. */
  readonly peek: (identity: RoleIdentity) => Credentials | undefined;
  readonly forget: (identity: RoleIdentity) => void;
  readonly isFresh: (credentials: Credentials) => boolean;
  readonly sessionDurationSeconds: number;
  readonly now: () => number;
  readonly random: () => number;
}

interface RefreshAhead {
  readonly supply: CredentialSupply;
  /** A live pod uses this identity: fetch it now (or at its first use) and keep it refreshed until untrack. */
  readonly track: (identity: RoleIdentity) => void;
  /** One user of the identity went away; with the last one, the identity is forgotten. */
  readonly untrack: (identity: RoleIdentity) => void;
  readonly tracks: (key: string) => boolean;
  readonly stop: () => void;
}

interface Tracked {
  readonly identity: RoleIdentity;
  /** How many live pod IPs use this identity (a dual-stack pod counts twice). */
  references: number;
  refreshFailures: number;
  /** The credentials the timer was set for: requests that joined one fetch plan it once. */
  plannedFor?: Credentials;
  timer?: NodeJS.Timeout;
}

export function refreshAhead(inner: CredentialSupply, options: RefreshAheadOptions): RefreshAhead {
  const tracked = new Map<string, Tracked>();
  let stopped = false;

  const setTimer = (entry: Tracked, delayMs: number) => {
    clearTimeout(entry.timer);
    entry.timer = setTimeout(() => {
      entry.timer = undefined;
      refresh(identityKey(entry.identity));
    }, delayMs);
  };

  /** New credentials for a tracked identity: plan their renewal. */
  const plan = (key: string, credentials: Credentials) => {
    const entry = tracked.get(key);
    if (!entry || entry.plannedFor === credentials) return;
    entry.plannedFor = credentials;
    entry.refreshFailures = 0;
    // STS may grant less than asked (role chaining caps at 1 h): never refresh in a tight loop.
    const delay = refreshDelayMs(
      credentials.expiration.getTime(),
      options.now(),
      options.sessionDurationSeconds,
      options.random,
    );
    setTimer(entry, Math.max(REFRESH_RETRY.initialMs, delay));
  };

  const supply: CredentialSupply = async (identity, request) => {
    const supplied = await inner(identity, request);
    if (supplied.freshness === 'miss') plan(identityKey(identity), supplied.credentials);
    return supplied;
  };

  const refresh = (key: string) => {
    const entry = tracked.get(key);
    if (!entry) return;
    supply(entry.identity, { priority: 'background', renew: true }).catch(() => {
      const again = tracked.get(key);
      if (!again || stopped) return;
      setTimer(again, fullJitterMs(again.refreshFailures++, REFRESH_RETRY, options.random) + REFRESH_RETRY.initialMs);
    });
  };

  return {
    supply,
    track(identity) {
      const key = identityKey(identity);
      const existing = tracked.get(key);
      if (existing) {
        existing.references++;
        return;
      }
      tracked.set(key, { identity, references: 1, refreshFailures: 0 });
      const held = options.peek(identity);
      if (held && options.isFresh(held)) plan(key, held);
      else if (options.prefetch !== 'first-use') refresh(key);
    },
    untrack(identity) {
      const key = identityKey(identity);
      const entry = tracked.get(key);
      if (!entry || --entry.references > 0) return;
      clearTimeout(entry.timer);
      tracked.delete(key);
      options.forget(identity);
    },
    tracks: (key) => tracked.has(key),
    stop() {
      stopped = true;
      for (const entry of tracked.values()) clearTimeout(entry.timer);
      tracked.clear();
    },
  };
}
