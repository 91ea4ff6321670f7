import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { fullJitterMs, retryDelayMs } from '../../src/backoff.js';

const backoff = { initialMs: 100, maxMs: 1_000 };

describe('retry backoff', () => {
  it('doubles per attempt up to the cap, with equal jitter between half and all of it', () => {
    assert.deepEqual(
      [0, 1, 2, 3, 4, 10].map((attempt) => retryDelayMs(attempt, backoff, () => 1)),
      [100, 200, 400, 800, 1000, 1000],
    );
    assert.deepEqual(
      [0, 1, 4].map((attempt) => retryDelayMs(attempt, backoff, () => 0)),
      [50, 100, 500],
    );
  });

  it('spreads full jitter from 0 to the same ceiling', () => {
    assert.equal(
      fullJitterMs(3, backoff, () => 0),
      0,
    );
    assert.equal(
      fullJitterMs(3, backoff, () => 0.999_999),
      799,
    );
    assert.equal(
      fullJitterMs(20, backoff, () => 0.5),
      500,
    );
  });
});
