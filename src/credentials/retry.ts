/**
 * Retries with full-jitter backoff (AWS's advice for a throttling service): each attempt goes
 * through the layers below again, so each one waits for its own rate-limit token.
 */
import { setMaxListeners } from 'node:events';
import { setTimeout as delay } from 'node:timers/promises';
import { type Backoff, fullJitterMs } from '../backoff.js';
import { type CredentialSupply, SupplyStopped } from './supply.js';

interface RetryOptions extends Backoff {
  /** Attempts in all, the first included. */
  readonly attempts: number;
  readonly retryable: (error: unknown) => boolean;
  readonly random: () => number;
}

interface Retrying {
  readonly supply: CredentialSupply;
  /** Ends every backoff wait with SupplyStopped. */
  readonly stop: () => void;
}

export function retrying(inner: CredentialSupply, options: RetryOptions): Retrying {
  const stopping = new AbortController();
  // Every backoff wait listens for stop(): thousands at once are expected under throttling, not a leak.
  setMaxListeners(0, stopping.signal);
  const { signal } = stopping;
  const supply: CredentialSupply = async (identity, request) => {
    for (let attempt = 0; ; attempt++) {
      if (signal.aborted) throw new SupplyStopped();
      try {
        return await inner(identity, request);
      } catch (error) {
        if (!options.retryable(error) || attempt + 1 >= options.attempts) throw error;
        await delay(fullJitterMs(attempt, options, options.random), undefined, { signal }).catch(() => {
          throw new SupplyStopped();
        });
      }
    }
  };
  return { supply, stop: () => stopping.abort() };
}
