/**
 * TokenReviews remembered by the SHA-256 of the token (never the token itself): an accepted one
 * until the token expires or its pod goes, a refused one for a short while, so that a client
 * retrying with a bad token does not send a TokenReview per attempt. Concurrent requests with the
 * same token share one review. Bounded: the oldest entry makes room for a new one.
 */
import { createHash } from 'node:crypto';
import type { Review, ReviewToken } from './token-review.js';

export interface ReviewCacheOptions {
  readonly review: ReviewToken;
  readonly maxEntries: number;
  /** How long a refusal is remembered. */
  readonly refusalTtlMs: number;
  readonly now?: () => number;
}

interface Entry {
  readonly review: Review;
  readonly untilMs: number;
}

export interface CachedReview {
  readonly review: Review;
  /** Answered from memory: no API call for this request. */
  readonly cached: boolean;
}

export class ReviewCache {
  private readonly entries = new Map<string, Entry>();
  private readonly inFlight = new Map<string, Promise<Review>>();
  private readonly now: () => number;

  constructor(private readonly options: ReviewCacheOptions) {
    this.now = options.now ?? Date.now;
  }

  /** @param expiresAtMs the token's own exp, from the local check: an accepted review lives no longer. */
  async review(token: string, expiresAtMs: number): Promise<CachedReview> {
    const key = createHash('sha256').update(token).digest('base64url');
    const entry = this.entries.get(key);
    if (entry && entry.untilMs > this.now()) return { review: entry.review, cached: true };
    if (entry) this.entries.delete(key);
    let pending = this.inFlight.get(key);
    if (!pending) {
      pending = this.options.review(token).finally(() => this.inFlight.delete(key));
      this.inFlight.set(key, pending);
      pending.then(
        (review) =>
          this.remember(key, review, review.authenticated ? expiresAtMs : this.now() + this.options.refusalTtlMs),
        () => undefined, // an API error is not an answer about the token: nothing to remember
      );
    }
    return { review: await pending, cached: false };
  }

  /** The pod is gone: its tokens are refused from now on, whatever they say. */
  forgetPod(uid: string): void {
    for (const [key, entry] of this.entries) {
      if (entry.review.authenticated && entry.review.subject.podUid === uid) this.entries.delete(key);
    }
  }

  size(): number {
    return this.entries.size;
  }

  private remember(key: string, review: Review, untilMs: number): void {
    this.entries.delete(key);
    while (this.entries.size >= this.options.maxEntries) {
      const oldest = this.entries.keys().next().value as string;
      this.entries.delete(oldest);
    }
    this.entries.set(key, { review, untilMs });
  }
}
