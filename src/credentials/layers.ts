/**
 * Credential supply assembled from its layers, innermost first: each takes the supply below it
 * and returns one, so the order here is the order a request travels, from STS outwards.
 */
import type { Credentials } from '../model/credentials.js';
import type { RoleIdentity } from '../model/role-identity.js';
import { cached } from './cache.js';
import { withinDeadline } from './deadline.js';
import { minimumRemainingMs } from './lifetimes.js';
import { rateLimited } from './rate-limit.js';
import { type Prefetch, refreshAhead } from './refresh-ahead.js';
import { retrying } from './retry.js';
import { staticStability } from './static-stability.js';
import { type AssumeRole, type StsCallReport, StsError, stsSupply } from './sts.js';
import type { CredentialSupply } from './supply.js';

export interface CredentialSupplyOptions {
  readonly assumeRole: AssumeRole;
  readonly sessionDurationSeconds: number;
  /** AssumeRole calls per second and burst; unlimited when absent (unit tests). */
  readonly rateLimit?: { readonly ratePerSecond: number; readonly burst: number };
  /** Cached identities kept at most; unbounded when absent. */
  readonly maxEntries?: number;
  /** When a live pod's identity is first fetched (BROKER_PREFETCH); arrival when absent. */
  readonly prefetch?: Prefetch;
  /** Every STS attempt, for the audit stream. */
  readonly onStsCall?: (report: StsCallReport) => void;
  readonly now?: () => number;
  readonly random?: () => number;
}

interface CredentialSupplyStack {
  /** The outermost layer: what every door asks. */
  readonly supply: CredentialSupply;
  track(identity: RoleIdentity): void;
  untrack(identity: RoleIdentity): void;
  /** Identities whose credentials are cached. */
  size(): number;
  /** STS calls waiting for a rate-limit token. */
  queuedCalls(): number;
  stop(): void;
}

const STS_RETRY = { initialMs: 100, maxMs: 5_000, attempts: 8 } as const;

export function credentialSupply(options: CredentialSupplyOptions): CredentialSupplyStack {
  const now = options.now ?? Date.now;
  const random = options.random ?? Math.random;
  const minimumRemaining = minimumRemainingMs(options.sessionDurationSeconds);
  const isFresh = (credentials: Credentials) => credentials.expiration.getTime() - now() >= minimumRemaining;

  const sts = stsSupply(options.assumeRole, options.sessionDurationSeconds, options.onStsCall);
  const limit = options.rateLimit && rateLimited(sts, { ...options.rateLimit, now });
  const retries = retrying(limit?.supply ?? sts, {
    ...STS_RETRY,
    retryable: (error) => error instanceof StsError && error.retryable,
    random,
  });
  const cache = cached(retries.supply, { isFresh, maxEntries: options.maxEntries, keep: (key) => refresh.tracks(key) });
  const refresh = refreshAhead(cache.supply, {
    prefetch: options.prefetch,
    peek: cache.peek,
    forget: cache.forget,
    isFresh,
    sessionDurationSeconds: options.sessionDurationSeconds,
    now,
    random,
  });
  const supply = staticStability(withinDeadline(refresh.supply), { lastKnown: cache.peek, now });

  return {
    supply,
    track: refresh.track,
    untrack: refresh.untrack,
    size: cache.size,
    queuedCalls: () => limit?.waiting() ?? 0,
    stop() {
      refresh.stop();
      retries.stop();
      limit?.stop();
    },
  };
}
