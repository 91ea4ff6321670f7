import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, it, mock } from 'node:test';
import { Coalescer, refusalKey } from '../../src/audit/coalesce.js';
import type { AuditEventBody } from '../../src/audit/events.js';

const denied = (podIp: string, reason = 'role "x" is not this pod\'s role', requestId = 'r'): AuditEventBody => ({
  type: 'credential.denied',
  podIp,
  status: 404,
  reason,
  waitedMs: 0,
  requestId,
});

describe('coalescing repeated refusals', () => {
  let published: AuditEventBody[];
  let coalescer: Coalescer;
  beforeEach(() => {
    mock.timers.enable({ apis: ['setInterval'] });
    published = [];
    coalescer = new Coalescer({
      intervalMs: 10_000,
      maxKeys: 3,
      keyOf: refusalKey,
      publish: (body) => void published.push(body),
    });
  });
  afterEach(() => {
    coalescer.stop();
    mock.timers.reset();
  });

  it('publishes the first refusal at once and its repeats as one event with their count per interval', () => {
    for (let i = 0; i < 1_000; i += 1) coalescer.record(denied('10.0.0.1', undefined, `r${i}`));
    assert.equal(published.length, 1);
    assert.equal((published[0] as { count?: number }).count, undefined);
    mock.timers.tick(10_000);
    assert.equal(published.length, 2);
    assert.deepEqual({ ...published[1] }, { ...denied('10.0.0.1', undefined, 'r999'), count: 999 });
    // A quiet interval publishes nothing and forgets the key: the next refusal is reported at once again.
    mock.timers.tick(10_000);
    mock.timers.tick(10_000);
    assert.equal(published.length, 2);
    coalescer.record(denied('10.0.0.1'));
    assert.equal(published.length, 3);
  });

  it('keeps callers and reasons apart, and passes every other event through', () => {
    coalescer.record(denied('10.0.0.1'));
    coalescer.record(denied('10.0.0.2'));
    coalescer.record(denied('10.0.0.1', 'another reason'));
    coalescer.record({ type: 'token.issued', podIp: '10.0.0.1', ttlSeconds: 60 });
    coalescer.record({ type: 'token.issued', podIp: '10.0.0.1', ttlSeconds: 60 });
    assert.deepEqual(
      published.map((body) => body.type),
      ['credential.denied', 'credential.denied', 'credential.denied', 'token.issued', 'token.issued'],
    );
  });

  it('publishes beyond its key limit rather than hold unbounded keys', () => {
    for (const ip of ['a', 'b', 'c', 'd', 'e']) coalescer.record(denied(ip));
    coalescer.record(denied('e'));
    assert.equal(published.length, 6);
  });

  it('publishes what it counted when stopped', () => {
    coalescer.record({ type: 'request.throttled', podIp: '10.0.0.1', limit: 'rate' });
    coalescer.record({ type: 'request.throttled', podIp: '10.0.0.1', limit: 'rate' });
    coalescer.stop();
    assert.deepEqual(published.at(-1), { type: 'request.throttled', podIp: '10.0.0.1', limit: 'rate', count: 1 });
  });
});
