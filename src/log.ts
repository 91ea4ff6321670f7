/** Structured JSON logs (pino). Audit events are logged by subscribing to the audit stream, never by hand. */
import { pino, type Logger, type DestinationStream } from 'pino';
import type { Observable, Subscription } from 'rxjs';
import type { AuditEvent } from './audit/events.js';

export function createLogger(level: string, destination?: DestinationStream): Logger {
  return pino({ level, base: { app: 'kube-iam-broker' }, timestamp: pino.stdTimeFunctions.isoTime }, destination);
}

/** Decisions about credentials are info; bookkeeping (tokens, pods indexed) is debug. */
const DEBUG_EVENTS = new Set<AuditEvent['type']>(['token.issued', 'pod.indexed', 'pod.removed']);

export function logAuditEvents(events: Observable<AuditEvent>, logger: Logger): Subscription {
  return events.subscribe((event) => {
    const { type, id: _id, v: _v, time: _time, ...fields } = event;
    if (DEBUG_EVENTS.has(type)) logger.debug({ event: type, ...fields }, type);
    else if (type === 'credential.denied' || isTrouble(event)) logger.warn({ event: type, ...fields }, type);
    else logger.info({ event: type, ...fields }, type);
  });
}

/** A failed STS attempt, and credentials served stale because STS failed (static stability), are warnings. */
const isTrouble = (event: AuditEvent): boolean => (event.type === 'sts.call' && event.outcome !== 'success') || (event.type === 'credential.issued' && event.cache === 'stale');
