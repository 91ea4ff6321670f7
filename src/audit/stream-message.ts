/**
 * What a subscriber of GET /events receives: audit events, plus a stream.gap notice where events
 * were not delivered to it (it read too slowly, or resumed from an id no longer buffered). The
 * notice is about one subscription, not a decision of the agent, so it is never on events$.
 */
import { z } from 'zod';
import { AUDIT_SCHEMA_VERSION, AuditEventSchema } from './events.js';

export const StreamGapSchema = z
  .object({
    v: z.literal(AUDIT_SCHEMA_VERSION),
    type: z.literal('stream.gap'),
    time: z.iso.datetime(),
    reason: z.enum(['subscriber-too-slow', 'not-buffered']),
    /** How many events it did not receive: those matching its filters when too slow; every evicted one when not buffered. */
    dropped: z.number().int().positive(),
    /** The ids missed, where known: a resume with Last-Event-ID can fetch those still buffered. */
    firstId: z.number().int().positive().optional(),
    lastId: z.number().int().positive().optional(),
  })
  .meta({ description: 'Events this subscriber did not receive; sent in their place.' });

export const StreamMessageSchema = z.union([AuditEventSchema, StreamGapSchema]).meta({
  title: 'kube-iam-broker audit stream message',
  description: `One line of GET /events (NDJSON) or the data of one SSE message. Schema version ${AUDIT_SCHEMA_VERSION} (field v).`,
});

export type StreamGap = z.infer<typeof StreamGapSchema>;
export type StreamMessage = z.infer<typeof StreamMessageSchema>;

/** The text of the committed docs/audit-events.schema.json (npm run schema:audit writes it; a test checks it). */
export const renderAuditJsonSchema = (): string =>
  `${JSON.stringify(z.toJSONSchema(StreamMessageSchema, { io: 'output' }), null, 2)}\n`;
