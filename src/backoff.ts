/** Capped exponential retry delays: one formula for every retry loop in the agent. */

export interface Backoff {
  readonly initialMs: number;
  readonly maxMs: number;
}

/** The delay ceiling of a 0-based attempt: initialMs doubled per attempt, capped at maxMs. */
const ceilingMs = (attempt: number, backoff: Backoff): number =>
  Math.min(backoff.maxMs, backoff.initialMs * 2 ** attempt);

/** Equal jitter: between half and all of the ceiling, so many agents spread out yet none retries too early. */
export function retryDelayMs(attempt: number, backoff: Backoff, random: () => number = Math.random): number {
  const ceiling = ceilingMs(attempt, backoff);
  return Math.round(ceiling / 2 + (random() * ceiling) / 2);
}

/** Full jitter: anywhere from 0 to the ceiling, the spread AWS advises for calls to a throttling service. */
export function fullJitterMs(attempt: number, backoff: Backoff, random: () => number = Math.random): number {
  return Math.floor(random() * ceilingMs(attempt, backoff));
}
