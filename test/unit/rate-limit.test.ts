import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type Ticket, TokenBucket, nextWaiter } from '../../src/credentials/rate-limit.js';
import { msUntilToken, refill } from '../../src/token-bucket.js';

describe('STS token bucket', () => {
  it('refills at the rate and never above the burst', () => {
    assert.deepEqual(refill({ tokens: 0, atMs: 0 }, 500, 10, 20), { tokens: 5, atMs: 500 });
    assert.deepEqual(refill({ tokens: 19, atMs: 0 }, 10_000, 10, 20), { tokens: 20, atMs: 10_000 });
    assert.equal(msUntilToken({ tokens: 0.5, atMs: 0 }, 10), 50);
    assert.equal(msUntilToken({ tokens: 1, atMs: 0 }, 10), 0);
  });

  it('serves the oldest client waiter before older background waiters', () => {
    const queue = [
      { ticket: { priority: 'background' } as Ticket, id: 1 },
      { ticket: { priority: 'client' } as Ticket, id: 2 },
    ];
    assert.equal(nextWaiter(queue)?.id, 2);
    assert.equal(nextWaiter([queue[0] as (typeof queue)[0]])?.id, 1);
  });

  it('lets the burst through at once, then one call per token, clients first', async () => {
    let now = 0;
    const bucket = new TokenBucket({ ratePerSecond: 1000, burst: 2, now: () => now });
    const order: string[] = [];
    const take = (name: string, ticket: Ticket) => bucket.acquire(ticket).then(() => order.push(name));
    const all = [
      take('a', { priority: 'background' }),
      take('b', { priority: 'background' }),
      take('bg', { priority: 'background' }),
    ];
    const promoted: Ticket = { priority: 'background' };
    all.push(take('promoted', promoted), take('client', { priority: 'client' }));
    promoted.priority = 'client'; // a client joined this background fetch
    await Promise.resolve();
    assert.deepEqual(order, ['a', 'b']);
    for (const expected of ['promoted', 'client', 'bg']) {
      now += 1; // one token's worth of time
      await until(() => order.at(-1) === expected);
    }
    await Promise.all(all);
    assert.deepEqual(order, ['a', 'b', 'promoted', 'client', 'bg']);
    bucket.stop();
  });

  it('refuses waiters when stopped, and drops a waiter whose signal fires', async () => {
    const bucket = new TokenBucket({ ratePerSecond: 1, burst: 1, now: () => 0 });
    await bucket.acquire({ priority: 'client' });
    const aborter = new AbortController();
    const aborted = bucket.acquire({ priority: 'client' }, aborter.signal);
    aborter.abort(new Error('gone'));
    await assert.rejects(aborted, /gone/);
    assert.equal(bucket.waiting(), 0);
    const pending = bucket.acquire({ priority: 'background' });
    bucket.stop();
    await assert.rejects(pending, /stopped/);
  });
});

async function until(condition: () => boolean, timeoutMs = 2_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}
