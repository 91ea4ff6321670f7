/**
 * Repeated identical audit events from one caller, coalesced: the first of a kind in an interval
 * is published at once (an operator sees a new problem immediately), the repeats are counted, and
 * at the end of the interval one event stands for them all with `count`. The log line, the
 * metrics and /events all read that one event, so a pod that repeats a refused request thousands
 * of times a second costs one line and one buffered event per interval, not one per request.
 *
 * Which events coalesce, and what makes two "identical", is the key function's choice: refusals
 * by caller, type, status and reason here; a key on (caller, role) for cache hits turns the same
 * mechanism into a periodic per-pod summary of hits.
 */
import { type AuditEventBody, type CountableBody, isCountable } from './events.js';

export interface CoalescerOptions {
  readonly intervalMs: number;
  /** Distinct keys held in one interval; beyond it events are published as they come (the per-caller rate limit still bounds them). */
  readonly maxKeys: number;
  /** The identity of an event for coalescing; undefined publishes it as is. */
  readonly keyOf: (body: CountableBody) => string | undefined;
  readonly publish: (body: AuditEventBody) => void;
}

interface Pending {
  /** The latest repeat: the summary carries its request id and details. */
  latest: CountableBody;
  repeats: number;
}

export class Coalescer {
  private readonly pending = new Map<string, Pending>();
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly options: CoalescerOptions) {}

  readonly record = (body: AuditEventBody): void => {
    const key = isCountable(body) ? this.options.keyOf(body) : undefined;
    if (key === undefined) return this.options.publish(body);
    const countable = body as CountableBody;
    const seen = this.pending.get(key);
    if (seen) {
      seen.latest = countable;
      seen.repeats += 1;
      return;
    }
    if (this.pending.size >= this.options.maxKeys) return this.options.publish(body);
    this.pending.set(key, { latest: countable, repeats: 0 });
    this.options.publish(body);
    this.timer ??= setInterval(() => this.flush(), this.options.intervalMs);
  };

  /**
   * Publishes one event per key repeated since the last flush. A key without repeats is forgotten,
   * so the next occurrence is published at once again; the timer runs only while keys are held.
   */
  flush(): void {
    for (const [key, entry] of this.pending) {
      if (entry.repeats === 0) {
        this.pending.delete(key);
        continue;
      }
      this.options.publish({ ...entry.latest, count: entry.repeats });
      entry.repeats = 0;
    }
    if (this.pending.size === 0) this.stopTimer();
  }

  /** Publishes what is counted and stops the timer (at shutdown: no count is lost). */
  stop(): void {
    this.flush();
    this.pending.clear();
    this.stopTimer();
  }

  private stopTimer(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}

/** Refusals (denied credentials, refused tokens, throttled requests) coalesce per caller, type, status and reason. */
export function refusalKey(body: CountableBody): string | undefined {
  switch (body.type) {
    case 'credential.denied':
      return `${body.type}|${body.podIp}|${body.status}|${body.reason}`;
    case 'token.refused':
      return `${body.type}|${body.podIp}|${body.reason}`;
    case 'request.throttled':
      return `${body.type}|${body.podIp}|${body.limit}`;
  }
}
