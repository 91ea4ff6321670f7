/**
 * The audit stream: every credential decision the agent makes, as one typed event. Logs, metrics
 * and the admin /events endpoint all read this stream; nothing keeps a second record.
 */
import { Observable, Subject } from 'rxjs';
import { z } from 'zod';

export const AUDIT_SCHEMA_VERSION = 1;

/** Who the event is about. Any field may be absent (an unknown caller has only an IP). */
const Subject_ = z.object({
  requestId: z.string().optional(),
  podIp: z.string().optional(),
  namespace: z.string().optional(),
  pod: z.string().optional(),
  serviceAccount: z.string().optional(),
  roleArn: z.string().optional(),
  /** The door a request came through: metadata (identified by source IP) or container (by its service-account token). */
  door: z.enum(['metadata', 'container']).optional(),
});

const ResolvedBy = z.enum(['index', 'push']);

/** The rows of the hold table (src/imds/client-holds.ts): which client's hold a request got. */
export const HoldClient = z.enum(['botocore', 'js-sdk-v3', 'go-sdk-v1', 'go-sdk-v2', 'ruby-sdk-v3', 'unrecognised']);
export type HoldClient = z.infer<typeof HoldClient>;

/** On an event that stands for repeats (src/audit/coalesce.ts): how many identical events of this caller it stands for, since the previous event with the same key. Absent: one. */
const Count = z.number().int().positive().optional();

/** Why a credential request was refused, as a bounded label (metrics' `reason`); the free text is `reason`. */
export const DenialCause = z.enum([
  'unknown-pod',
  'base-arn-unknown',
  'no-role',
  'role-denied',
  'role-mismatch',
  'sts-failed',
  'index-stale',
  'token',
]);
export type DenialCause = z.infer<typeof DenialCause>;

const EventBodies = z.discriminatedUnion('type', [
  Subject_.extend({
    type: z.literal('credential.issued'),
    /** The pod's annotation, its ServiceAccount's annotation, or the default role. */
    source: z.enum(['annotation', 'service-account', 'default']),
    resolvedBy: ResolvedBy,
    waitedMs: z.number().nonnegative(),
    expiration: z.string(),
    /** hit: cached; miss: fetched for this request; stale: STS failed or was slow, served below the usual minimum life. */
    cache: z.enum(['hit', 'miss', 'stale']).optional(),
  }),
  Subject_.extend({
    type: z.literal('credential.denied'),
    status: z.number().int(),
    reason: z.string(),
    cause: DenialCause.optional(),
    requestedRole: z.string().optional(),
    waitedMs: z.number().nonnegative(),
    count: Count,
  }),
  // A request refused because its caller is over a per-caller limit (src/http/caller-limits.ts): answered 429.
  Subject_.extend({
    type: z.literal('request.throttled'),
    limit: z.enum(['rate', 'connections', 'waiting']),
    count: Count,
  }),
  Subject_.extend({
    type: z.literal('lookup.waited'),
    waitedMs: z.number().nonnegative(),
    /** push: the caller's pod arrived while it waited; retry: the hold ended first (a refusal: 503, or 403 for an unknown namespace). */
    outcome: z.enum(['push', 'retry']),
    /** How long this request could wait, chosen by its User-Agent, and whose row of the hold table that was. */
    holdMs: z.number().nonnegative(),
    holdClient: HoldClient,
  }),
  // Credential supply (prefetch, refresh, rate limit): one event per AssumeRole attempt.
  Subject_.extend({
    type: z.literal('sts.call'),
    sessionName: z.string(),
    trigger: z.enum(['client', 'background']),
    attempt: z.number().int().nonnegative(),
    durationMs: z.number().nonnegative(),
    outcome: z.enum(['success', 'throttled', 'error']),
    error: z.string().optional(),
  }),
  Subject_.extend({ type: z.literal('token.issued'), ttlSeconds: z.number().int() }),
  Subject_.extend({ type: z.literal('token.refused'), reason: z.string(), count: Count }),
  Subject_.extend({ type: z.literal('pod.indexed'), previousPod: z.string().optional() }),
  Subject_.extend({ type: z.literal('pod.removed') }),
  // Node integration (src/node/): the DNAT rule's lifecycle and the stale connections dropped.
  Subject_.extend({
    type: z.literal('node.iptables'),
    action: z.enum(['installed', 'in-place', 'reinstalled', 'removed']),
    detail: z.string(),
  }),
  Subject_.extend({
    type: z.literal('node.conntrack'),
    action: z.literal('dropped'),
    detail: z.string(),
    count: z.number().int().nonnegative(),
  }),
]);

export const AuditEventSchema = z.intersection(
  z.object({
    v: z.literal(AUDIT_SCHEMA_VERSION),
    id: z.number().int().positive(),
    time: z.iso.datetime(),
  }),
  EventBodies,
);

export type AuditEventBody = z.infer<typeof EventBodies>;
export type AuditEvent = z.infer<typeof AuditEventSchema>;
export type AuditEventType = AuditEventBody['type'];
export const AUDIT_EVENT_TYPES: readonly AuditEventType[] = EventBodies.options.map(
  (option) => option.shape.type.value,
);

/** Events that may stand for identical repeats (field `count`). */
export type CountableBody = Extract<
  AuditEventBody,
  { type: 'credential.denied' | 'token.refused' | 'request.throttled' }
>;
const COUNTABLE_TYPES = new Set<AuditEventType>(['credential.denied', 'token.refused', 'request.throttled']);
export const isCountable = (body: AuditEventBody): body is CountableBody => COUNTABLE_TYPES.has(body.type);

export class AuditStream {
  private readonly subject = new Subject<AuditEvent>();
  readonly events$: Observable<AuditEvent> = this.subject.asObservable();

  /**
   * Ids start from the start time in microseconds, so a restarted agent's ids are above its previous
   * run's and a subscriber resuming with Last-Event-ID misses nothing the new run published.
   */
  constructor(
    private readonly now: () => Date = () => new Date(),
    private lastId = now().getTime() * 1000,
  ) {}

  /**
   * Validates the body, stamps it (version, id, time: made here, so not validated again) and
   * publishes it; returns the event as published.
   */
  publish(body: AuditEventBody): AuditEvent {
    const event: AuditEvent = {
      v: AUDIT_SCHEMA_VERSION,
      id: ++this.lastId,
      time: this.now().toISOString(),
      ...EventBodies.parse(body),
    };
    this.subject.next(event);
    return event;
  }

  complete(): void {
    this.subject.complete();
  }
}
