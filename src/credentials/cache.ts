/**
 * Credentials per identity (role ARN, external ID, session name).
 *
 * - One STS call however many requests arrive together (single flight per identity).
 * - Identities a live pod uses are tracked: fetched as soon as the pod appears and refreshed ahead
 *   of the point where they would stop being handed out, with jitter so refreshes spread out.
 * - STS calls go through the rate limiter and are retried with full-jitter backoff; a client
 *   request waits at most its deadline, after which the fetch carries on in the background.
 * - Static stability: when STS fails or is slow, credentials still valid are served until their
 *   real expiry, even below the usual minimum remaining life (reported as stale).
 * - Bounded: past `maxEntries`, the least recently used identity no live pod uses goes first.
 */
import { setMaxListeners } from 'node:events';
import { fullJitterMs } from '../backoff.js';
import type { RoleIdentity } from '../broker/policy.js';
import { minimumRemainingMs, refreshDelayMs } from './lifetimes.js';
import { type Priority, type Ticket, TokenBucket } from './rate-limit.js';
import { type AssumeRole, type Credentials, StsError, toStsError } from './sts.js';

export interface StsCallReport {
  readonly identity: RoleIdentity;
  readonly trigger: Priority;
  readonly attempt: number;
  readonly durationMs: number;
  readonly error?: StsError;
}

export interface CredentialCacheOptions {
  readonly assumeRole: AssumeRole;
  readonly sessionDurationSeconds: number;
  /** AssumeRole calls per second and burst; unlimited when absent (unit tests). */
  readonly rateLimit?: { readonly ratePerSecond: number; readonly burst: number };
  /** Cached identities kept at most; unbounded when absent. */
  readonly maxEntries?: number;
  /** Every STS attempt, for the audit stream. */
  readonly onStsCall?: (report: StsCallReport) => void;
  /**
   * When a tracked identity is first fetched: on arrival (track fetches it at once) or on first
   * use (the first request fetches it; from then on it is refreshed ahead like any tracked one).
   */
  readonly prefetch?: Prefetch;
  readonly now?: () => number;
  readonly random?: () => number;
}

export type Freshness = 'hit' | 'miss' | 'stale';
export type Prefetch = 'arrival' | 'first-use';

export interface CachedCredentials {
  readonly credentials: Credentials;
  /** true when no STS call was needed for this request. */
  readonly cached: boolean;
  /** hit: cached and fresh; miss: fetched for this request; stale: STS failed or was slow, served below the usual minimum life. */
  readonly freshness: Freshness;
}

export const identityKey = (identity: RoleIdentity): string => `${identity.roleArn}|${identity.externalId ?? ''}|${identity.sessionName}`;

export const BACKOFF = { initialMs: 100, maxMs: 5_000, attempts: 8 } as const;
/** After a fetch gave up, a tracked identity tries again this much later (doubling, capped). */
export const REFRESH_RETRY = { initialMs: 10_000, maxMs: 5 * 60_000 } as const;

export class CacheStopped extends Error {
  constructor() {
    super('the credential cache was stopped');
    this.name = 'CacheStopped';
  }
}

interface InFlight {
  readonly promise: Promise<Credentials>;
  readonly ticket: Ticket;
}

interface Tracked {
  readonly identity: RoleIdentity;
  /** How many live pod IPs use this identity (a dual-stack pod counts twice). */
  references: number;
  refreshFailures: number;
  timer?: NodeJS.Timeout;
}

export class CredentialCache {
  /** Map order is recency order: a use moves the entry to the end. */
  private readonly entries = new Map<string, Credentials>();
  private readonly inFlight = new Map<string, InFlight>();
  private readonly tracked = new Map<string, Tracked>();
  private readonly bucket: TokenBucket | undefined;
  private readonly stopping = new AbortController();
  private readonly now: () => number;
  private readonly random: () => number;
  private readonly minimumRemaining: number;

  constructor(private readonly options: CredentialCacheOptions) {
    this.now = options.now ?? Date.now;
    this.random = options.random ?? Math.random;
    this.minimumRemaining = minimumRemainingMs(options.sessionDurationSeconds);
    this.bucket = options.rateLimit && new TokenBucket({ ...options.rateLimit, now: this.now });
    // Every backoff sleep listens for stop(): thousands at once are expected under throttling, not a leak.
    setMaxListeners(0, this.stopping.signal);
  }

  /**
   * Credentials for a client request. With a deadline, resolves by then: with fresh credentials,
   * with still-valid stale ones, or rejects with a retryable StsError; the fetch goes on regardless.
   */
  async get(identity: RoleIdentity, deadlineMs?: number): Promise<CachedCredentials> {
    const key = identityKey(identity);
    const entry = this.touch(key);
    if (entry && this.isFresh(entry)) return { credentials: entry, cached: true, freshness: 'hit' };
    const fetch = this.fetch(key, identity, 'client');
    try {
      return { credentials: await withDeadline(fetch, deadlineMs), cached: false, freshness: 'miss' };
    } catch (error) {
      const fallback = this.entries.get(key);
      if (fallback && fallback.expiration.getTime() > this.now()) return { credentials: fallback, cached: true, freshness: 'stale' };
      throw toStsError(error);
    }
  }

  /** A live pod uses this identity: fetch it now (or at its first use) and keep it refreshed until untrack. */
  track(identity: RoleIdentity): void {
    const key = identityKey(identity);
    const tracked = this.tracked.get(key);
    if (tracked) {
      tracked.references++;
      return;
    }
    this.tracked.set(key, { identity, references: 1, refreshFailures: 0 });
    const entry = this.entries.get(key);
    if (entry && this.isFresh(entry)) this.scheduleRefresh(key, entry);
    else if (this.options.prefetch !== 'first-use') this.refresh(key);
  }

  /** One user of the identity went away; with the last one, the identity is forgotten. */
  untrack(identity: RoleIdentity): void {
    const key = identityKey(identity);
    const tracked = this.tracked.get(key);
    if (!tracked || --tracked.references > 0) return;
    clearTimeout(tracked.timer);
    this.tracked.delete(key);
    this.entries.delete(key);
  }

  size(): number {
    return this.entries.size;
  }

  /** STS calls waiting for a rate-limit token. */
  queuedCalls(): number {
    return this.bucket?.waiting() ?? 0;
  }

  stop(): void {
    this.stopping.abort(new CacheStopped());
    this.bucket?.stop();
    for (const tracked of this.tracked.values()) clearTimeout(tracked.timer);
    this.tracked.clear();
  }

  private touch(key: string): Credentials | undefined {
    const entry = this.entries.get(key);
    if (entry) {
      this.entries.delete(key);
      this.entries.set(key, entry);
    }
    return entry;
  }

  private isFresh(credentials: Credentials): boolean {
    return credentials.expiration.getTime() - this.now() >= this.minimumRemaining;
  }

  private refresh(key: string): void {
    const tracked = this.tracked.get(key);
    if (!tracked) return;
    this.fetch(key, tracked.identity, 'background').catch(() => {
      const again = this.tracked.get(key);
      if (!again || this.stopping.signal.aborted) return;
      this.setTimer(again, key, fullJitterMs(again.refreshFailures++, REFRESH_RETRY, this.random) + REFRESH_RETRY.initialMs);
    });
  }

  private scheduleRefresh(key: string, credentials: Credentials): void {
    const tracked = this.tracked.get(key);
    if (!tracked) return;
    tracked.refreshFailures = 0;
    // STS may grant less than asked (role chaining caps at 1 h): never refresh in a tight loop.
    const delay = refreshDelayMs(credentials.expiration.getTime(), this.now(), this.options.sessionDurationSeconds, this.random);
    this.setTimer(tracked, key, Math.max(REFRESH_RETRY.initialMs, delay));
  }

  private setTimer(tracked: Tracked, key: string, delayMs: number): void {
    clearTimeout(tracked.timer);
    tracked.timer = setTimeout(() => {
      tracked.timer = undefined;
      this.refresh(key);
    }, delayMs);
  }

  private fetch(key: string, identity: RoleIdentity, priority: Priority): Promise<Credentials> {
    const pending = this.inFlight.get(key);
    if (pending) {
      if (priority === 'client') pending.ticket.priority = 'client';
      return pending.promise;
    }
    const ticket: Ticket = { priority };
    const promise = this.callWithRetries(identity, ticket)
      .then((credentials) => {
        this.store(key, credentials);
        return credentials;
      })
      .finally(() => this.inFlight.delete(key));
    // A fetch nobody awaits any more (the client's deadline passed) must not be an unhandled rejection.
    promise.catch(() => undefined);
    this.inFlight.set(key, { promise, ticket });
    return promise;
  }

  private async callWithRetries(identity: RoleIdentity, ticket: Ticket): Promise<Credentials> {
    const signal = this.stopping.signal;
    for (let attempt = 0; ; attempt++) {
      await this.bucket?.acquire(ticket); // stop() refuses every waiter itself
      if (signal.aborted) throw signal.reason;
      const startedAt = performance.now();
      try {
        const credentials = await this.options.assumeRole(identity, this.options.sessionDurationSeconds);
        this.options.onStsCall?.({ identity, trigger: ticket.priority, attempt, durationMs: performance.now() - startedAt });
        return credentials;
      } catch (raw) {
        const error = toStsError(raw);
        this.options.onStsCall?.({ identity, trigger: ticket.priority, attempt, durationMs: performance.now() - startedAt, error });
        if (!error.retryable || attempt + 1 >= BACKOFF.attempts) throw error;
        await sleep(fullJitterMs(attempt, BACKOFF, this.random), signal);
      }
    }
  }

  private store(key: string, credentials: Credentials): void {
    this.entries.delete(key);
    this.entries.set(key, credentials);
    this.scheduleRefresh(key, credentials);
    this.enforceBound();
  }

  /** Past the bound, drop the least recently used identity without a live pod, else the least recently used. */
  private enforceBound(): void {
    const max = this.options.maxEntries;
    if (max === undefined) return;
    while (this.entries.size > max) {
      let victim: string | undefined;
      for (const key of this.entries.keys()) {
        if (!this.tracked.has(key)) {
          victim = key;
          break;
        }
      }
      victim ??= this.entries.keys().next().value as string;
      this.entries.delete(victim);
    }
  }
}

export class DeadlineExceeded extends StsError {
  constructor(deadlineMs: number) {
    super(`no credentials from STS within ${deadlineMs} ms; still trying in the background`, 'DeadlineExceeded', false, true);
  }
}

function withDeadline<T>(promise: Promise<T>, deadlineMs: number | undefined): Promise<T> {
  if (deadlineMs === undefined) return promise;
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new DeadlineExceeded(deadlineMs)), Math.max(0, deadlineMs));
  });
  return Promise.race([promise, expired]).finally(() => clearTimeout(timer));
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason as Error);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason as Error);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
