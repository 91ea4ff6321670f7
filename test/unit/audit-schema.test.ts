import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { AUDIT_EVENT_TYPES, AuditStream } from '../../src/audit/events.js';
import { StreamMessageSchema, renderAuditJsonSchema } from '../../src/audit/stream-message.js';

describe('audit event schema', () => {
  it('docs/audit-events.schema.json is what the zod schema generates (run npm run schema:audit after changing it)', () => {
    const committed = readFileSync(new URL('../../docs/audit-events.schema.json', import.meta.url), 'utf8');
    assert.equal(committed, renderAuditJsonSchema());
  });

  it('documents every event type and the stream gap', () => {
    const text = renderAuditJsonSchema();
    for (const type of [...AUDIT_EVENT_TYPES, 'stream.gap']) assert.ok(text.includes(`"const": "${type}"`), type);
  });

  it("stamps id, time and version, and ids of a later run are above an earlier run's", () => {
    const earlier = new AuditStream(() => new Date('2026-11-29T19:00:00.000Z'));
    const later = new AuditStream(() => new Date('2026-11-29T19:00:00.002Z'));
    const first = earlier.publish({
      type: 'node.iptables',
      action: 'installed',
      detail: 'DNAT 169.254.169.254:80 to 10.0.0.1:8181',
    });
    for (let i = 0; i < 1000; i++) earlier.publish({ type: 'pod.removed', podIp: '10.0.0.9' });
    const next = later.publish({
      type: 'node.conntrack',
      action: 'dropped',
      detail: 'connections to 169.254.169.254',
      count: 3,
    });
    assert.deepEqual(StreamMessageSchema.parse(first), first);
    assert.equal(first.v, 1);
    assert.ok(next.id > first.id + 1000);
  });

  it('refuses an event that does not match its type', () => {
    const stream = new AuditStream();
    assert.throws(() => stream.publish({ type: 'node.conntrack', action: 'deleted' } as never));
  });
});
