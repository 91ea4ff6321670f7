/** Structured JSON logs (pino). Audit events are logged by subscribing to the audit stream, never by hand. */
import { pino, type Logger, type DestinationStream } from 'pino';
import type { Observable, Subscription } from 'rxjs';
import type { AuditEvent } from './audit/events.js';

/**
 * Log lines waiting for stdout at most. When stdout is slower than the agent logs (a flood, a slow
 * container runtime), lines beyond this are dropped and counted rather than queued without bound:
 * the alternative, synchronous writes, would stall every request on stdout (BENCHMARKS.md, logging).
 */
export const LOG_BUFFER_BYTES = 1024 * 1024;

export interface BoundedStdout {
  readonly stream: DestinationStream;
  /** Lines dropped so far because the buffer was full (kube_iam_broker_log_lines_dropped_total). */
  readonly dropped: () => number;
  /** Writes what is buffered, synchronously (before the process exits). */
  readonly flush: () => void;
}

export function boundedStdout(maxBytes = LOG_BUFFER_BYTES, fd = 1): BoundedStdout {
  const stream = pino.destination({ dest: fd, sync: false, maxLength: maxBytes });
  let dropped = 0;
  stream.on('drop', () => {
    dropped += 1;
  });
  const flush = () => {
    try {
      stream.flushSync();
    } catch {
      // stdout is gone or still busy: what is left cannot be written anyway.
    }
  };
  return { stream, dropped: () => dropped, flush };
}

export function createLogger(level: string, destination?: DestinationStream): Logger {
  return pino({ level, base: { app: 'kube-iam-broker' }, timestamp: pino.stdTimeFunctions.isoTime }, destination);
}

/** Decisions about credentials are info; bookkeeping (tokens issued and refused, pods indexed) is debug. */
const DEBUG_EVENTS = new Set<AuditEvent['type']>(['token.issued', 'token.refused', 'pod.indexed', 'pod.removed']);

export function logAuditEvents(events: Observable<AuditEvent>, logger: Logger): Subscription {
  return events.subscribe((event) => {
    const { type, id: _id, v: _v, time: _time, ...fields } = event;
    if (DEBUG_EVENTS.has(type)) logger.debug({ event: type, ...fields }, type);
    else if (type === 'credential.denied' || type === 'request.throttled' || isTrouble(event))
      logger.warn({ event: type, ...fields }, type);
    else logger.info({ event: type, ...fields }, type);
  });
}

/** A failed STS attempt, and credentials served stale because STS failed (static stability), are warnings. */
const isTrouble = (event: AuditEvent): boolean =>
  (event.type === 'sts.call' && event.outcome !== 'success') ||
  (event.type === 'credential.issued' && event.cache === 'stale');
