/**
 * A token bucket in front of STS AssumeRole: at most `burst` calls at once, refilled at
 * `ratePerSecond`. Waiters queue; a waiter a client is holding a request for goes before any
 * background refresh, and a background waiter is promoted when a client starts waiting on it.
 */
import { type BucketState, msUntilToken, refill } from '../token-bucket.js';
import type { CredentialSupply, Priority } from './supply.js';

export interface TokenBucketOptions {
  readonly ratePerSecond: number;
  readonly burst: number;
  readonly now?: () => number;
}

/** A place in the queue whose priority can rise while it waits (a client joined the fetch). */
export interface Ticket {
  priority: Priority;
}

/** The waiter served next: the oldest client, else the oldest background waiter. Pure. */
export function nextWaiter<W extends { readonly ticket: Ticket }>(queue: readonly W[]): W | undefined {
  return queue.find((waiter) => waiter.ticket.priority === 'client') ?? queue[0];
}

export class RateLimitStopped extends Error {
  constructor() {
    super('the STS rate limiter was stopped');
    this.name = 'RateLimitStopped';
  }
}

interface Waiter {
  readonly ticket: Ticket;
  readonly grant: () => void;
  readonly refuse: (error: Error) => void;
}

export class TokenBucket {
  private state: BucketState;
  private readonly queue: Waiter[] = [];
  private timer: NodeJS.Timeout | undefined;
  private readonly now: () => number;
  private stopped = false;

  constructor(private readonly options: TokenBucketOptions) {
    this.now = options.now ?? Date.now;
    this.state = { tokens: options.burst, atMs: this.now() };
  }

  /** Resolves when the caller may make one STS call; rejects when the signal fires or the bucket stops. */
  acquire(ticket: Ticket, signal?: AbortSignal): Promise<void> {
    if (this.stopped) return Promise.reject(new RateLimitStopped());
    if (signal?.aborted) return Promise.reject(signal.reason as Error);
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        this.remove(waiter);
        reject(signal?.reason as Error);
      };
      const waiter: Waiter = {
        ticket,
        grant: () => {
          signal?.removeEventListener('abort', onAbort);
          resolve();
        },
        refuse: (error) => {
          signal?.removeEventListener('abort', onAbort);
          reject(error);
        },
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.queue.push(waiter);
      this.drain();
    });
  }

  /** Calls waiting for a token, for the pending-work metric. */
  waiting(): number {
    return this.queue.length;
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    for (const waiter of this.queue.splice(0)) waiter.refuse(new RateLimitStopped());
  }

  private drain(): void {
    if (this.timer) return;
    const { ratePerSecond, burst } = this.options;
    this.state = refill(this.state, this.now(), ratePerSecond, burst);
    while (this.queue.length > 0 && this.state.tokens >= 1) {
      const waiter = nextWaiter(this.queue) as Waiter;
      this.remove(waiter);
      this.state = { ...this.state, tokens: this.state.tokens - 1 };
      waiter.grant();
    }
    if (this.queue.length === 0) return;
    this.timer = setTimeout(
      () => {
        this.timer = undefined;
        this.drain();
      },
      msUntilToken(this.state, ratePerSecond),
    );
  }

  private remove(waiter: Waiter): void {
    const at = this.queue.indexOf(waiter);
    if (at >= 0) this.queue.splice(at, 1);
  }
}

interface RateLimited {
  readonly supply: CredentialSupply;
  /** Calls waiting for a token, for the pending-work metric. */
  readonly waiting: () => number;
  readonly stop: () => void;
}

/** The rate limit as a layer: every call below it, retries included, waits for a token; the request is its ticket. */
export function rateLimited(inner: CredentialSupply, options: TokenBucketOptions): RateLimited {
  const bucket = new TokenBucket(options);
  let stopped = false;
  return {
    supply: async (identity, request) => {
      await bucket.acquire(request); // stop() refuses every waiter itself
      // A token granted just before stop() is not spent on STS.
      if (stopped) throw new RateLimitStopped();
      return inner(identity, request);
    },
    waiting: () => bucket.waiting(),
    stop: () => {
      stopped = true;
      bucket.stop();
    },
  };
}
