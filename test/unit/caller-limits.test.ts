import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { CallerLimits } from '../../src/http/caller-limits.js';

const limits = (now: () => number, overrides: Partial<ConstructorParameters<typeof CallerLimits>[0]> = {}) =>
  new CallerLimits({ ratePerSecond: 10, burst: 5, maxConnections: 2, maxWaiting: 2, now, ...overrides });

describe('per-caller limits', () => {
  it('admits the burst at once, then the rate, and says when the next request may come', () => {
    let now = 0;
    const caller = limits(() => now);
    for (let i = 0; i < 5; i += 1)
      assert.deepEqual(caller.admit('10.0.0.1'), { admitted: true }, `request ${i} of the burst`);
    assert.deepEqual(caller.admit('10.0.0.1'), { admitted: false, retryAfterSeconds: 1 });
    now = 100; // one token back at 10/s
    assert.deepEqual(caller.admit('10.0.0.1'), { admitted: true });
    assert.equal(caller.admit('10.0.0.1').admitted, false);
  });

  it('rounds Retry-After up to whole seconds at slow rates', () => {
    const caller = limits(() => 0, { ratePerSecond: 1, burst: 1 });
    caller.admit('10.0.0.1');
    assert.deepEqual(caller.admit('10.0.0.1'), { admitted: false, retryAfterSeconds: 1 });
    const slower = new CallerLimits({ ratePerSecond: 1, burst: 1, maxConnections: 1, maxWaiting: 1, now: () => 0 });
    slower.admit('a');
    // A refused request spends nothing: the next one is still a second away.
    assert.deepEqual(slower.admit('a'), { admitted: false, retryAfterSeconds: 1 });
  });

  it("keeps one caller hammering from spending another caller's budget", () => {
    const caller = limits(() => 0);
    for (let i = 0; i < 100; i += 1) caller.admit('10.0.0.1');
    assert.deepEqual(caller.admit('10.0.0.2'), { admitted: true });
  });

  it('caps open connections per caller and frees a slot when one closes', () => {
    const caller = limits(() => 0);
    assert.ok(caller.openConnection('10.0.0.1'));
    assert.ok(caller.openConnection('10.0.0.1'));
    assert.ok(!caller.openConnection('10.0.0.1'));
    assert.ok(caller.openConnection('10.0.0.2'), 'another caller has its own cap');
    caller.closeConnection('10.0.0.1');
    assert.ok(caller.openConnection('10.0.0.1'));
  });

  it('caps waiting lookups per caller; ending a wait twice frees one slot only', () => {
    const caller = limits(() => 0);
    const first = caller.beginWait('10.0.0.1');
    const second = caller.beginWait('10.0.0.1');
    assert.ok(first && second);
    assert.equal(caller.beginWait('10.0.0.1'), undefined);
    first();
    first();
    assert.ok(caller.beginWait('10.0.0.1'));
    assert.equal(caller.beginWait('10.0.0.1'), undefined);
  });

  it('forgets callers that hold nothing, so many passing callers do not grow its memory', () => {
    let now = 0;
    const caller = limits(() => now);
    let mostBuckets = 0;
    for (let i = 0; i < 5_000; i += 1) {
      const ip = `10.1.${i >> 8}.${i & 255}`;
      caller.admit(ip);
      caller.openConnection(ip);
      caller.closeConnection(ip);
      caller.beginWait(ip)?.();
      now += 1_000; // every earlier caller's bucket is full again
      mostBuckets = Math.max(mostBuckets, caller.tracked().buckets);
    }
    assert.ok(mostBuckets <= 1_024, `at most 1,024 idle callers' buckets are kept, held ${mostBuckets}`);
    assert.deepEqual({ ...caller.tracked(), buckets: 0 }, { buckets: 0, connections: 0, waiting: 0 });
  });
});
