/** Token-bucket arithmetic, shared by the STS rate limit and the per-caller request budget. Pure. */
export interface BucketState {
  readonly tokens: number;
  readonly atMs: number;
}

/** The bucket at `nowMs`: refilled since the last look, capped at the burst. */
export function refill(state: BucketState, nowMs: number, ratePerSecond: number, burst: number): BucketState {
  const elapsed = Math.max(0, nowMs - state.atMs);
  return { tokens: Math.min(burst, state.tokens + (elapsed * ratePerSecond) / 1000), atMs: nowMs };
}

/** How long until the bucket holds one whole token. */
export const msUntilToken = (state: BucketState, ratePerSecond: number): number =>
  state.tokens >= 1 ? 0 : Math.ceil(((1 - state.tokens) * 1000) / ratePerSecond);
