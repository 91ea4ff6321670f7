/**
 * What one caller (a source IP) may hold of the metadata port at once: a request budget (a token
 * bucket per caller: the per-caller rate limit, answered 429 with Retry-After as EC2's metadata
 * service does when it throttles), open connections, and lookups waiting for its pod. Every
 * count is per caller, so a pod hammering the port spends its own budget, not its neighbours'.
 */
import { type BucketState, msUntilToken, refill } from '../token-bucket.js';

export interface CallerLimitsOptions {
  /** Requests per second a caller may make, sustained. */
  readonly ratePerSecond: number;
  /** Requests a caller may make at once above the rate (the bucket's size). */
  readonly burst: number;
  readonly maxConnections: number;
  readonly maxWaiting: number;
  readonly now?: () => number;
}

export type Admission = { readonly admitted: true } | { readonly admitted: false; readonly retryAfterSeconds: number };

/** A bucket map holds at most this many callers before full (idle) buckets are forgotten: a full bucket is the same as none. */
const PRUNE_ABOVE = 1_024;

export class CallerLimits {
  private readonly buckets = new Map<string, BucketState>();
  private readonly connections = new Map<string, number>();
  private readonly waiting = new Map<string, number>();
  private readonly now: () => number;

  constructor(private readonly options: CallerLimitsOptions) {
    this.now = options.now ?? Date.now;
  }

  /** Spends one request of the caller's budget, or says when the next one is available. */
  admit(ip: string): Admission {
    const { ratePerSecond, burst } = this.options;
    const nowMs = this.now();
    const state = refill(this.buckets.get(ip) ?? { tokens: burst, atMs: nowMs }, nowMs, ratePerSecond, burst);
    if (state.tokens < 1) {
      this.buckets.set(ip, state);
      return { admitted: false, retryAfterSeconds: Math.max(1, Math.ceil(msUntilToken(state, ratePerSecond) / 1000)) };
    }
    if (!this.buckets.has(ip) && this.buckets.size >= PRUNE_ABOVE) this.pruneFullBuckets(nowMs);
    this.buckets.set(ip, { tokens: state.tokens - 1, atMs: nowMs });
    return { admitted: true };
  }

  /** Counts a new connection of the caller; false (and not counted) when it already holds its maximum. */
  openConnection(ip: string): boolean {
    return this.take(this.connections, ip, this.options.maxConnections);
  }

  closeConnection(ip: string): void {
    this.release(this.connections, ip);
  }

  /** Counts a lookup of the caller that waits for its pod; the returned function ends it. Undefined when the caller waits on too many already. */
  beginWait(ip: string): (() => void) | undefined {
    if (!this.take(this.waiting, ip, this.options.maxWaiting)) return undefined;
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.release(this.waiting, ip);
    };
  }

  /** Callers tracked (for tests and the memory bound: every map forgets a caller once it holds nothing). */
  tracked(): { readonly buckets: number; readonly connections: number; readonly waiting: number } {
    return { buckets: this.buckets.size, connections: this.connections.size, waiting: this.waiting.size };
  }

  private take(counts: Map<string, number>, ip: string, max: number): boolean {
    const held = counts.get(ip) ?? 0;
    if (held >= max) return false;
    counts.set(ip, held + 1);
    return true;
  }

  private release(counts: Map<string, number>, ip: string): void {
    const held = (counts.get(ip) ?? 0) - 1;
    if (held > 0) counts.set(ip, held);
    else counts.delete(ip);
  }

  private pruneFullBuckets(nowMs: number): void {
    const { ratePerSecond, burst } = this.options;
    for (const [ip, state] of this.buckets)
      if (refill(state, nowMs, ratePerSecond, burst).tokens >= burst) this.buckets.delete(ip);
  }
}
