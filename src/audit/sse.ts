/**
 * GET /events on the admin port: the audit stream as Server-Sent Events (or NDJSON when asked with
 * Accept: application/x-ndjson), filtered, resumable from a bounded buffer of recent events.
 *
 * Subscribers read events$ like the logs and metrics do; publishing never waits on them. A
 * subscriber that reads too slowly has a bounded queue: beyond it its events are counted, not
 * queued, and it gets one stream.gap notice with the count once its socket drains. The replay of
 * buffered events goes at the pace the subscriber reads, within the same bound, and the number of
 * subscribers is capped: what /events can hold is their product.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Observable, Subscription } from 'rxjs';
import { z } from 'zod';
import { AUDIT_EVENT_TYPES, AUDIT_SCHEMA_VERSION, type AuditEvent, type AuditEventType } from './events.js';
import type { StreamGap } from './stream-message.js';

export interface EventFeedOptions {
  readonly events$: Observable<AuditEvent>;
  /** Recent events kept for Last-Event-ID resumes and for one-shot reads. */
  readonly bufferSize: number;
  readonly heartbeatMs: number;
  /** Bytes queued for one subscriber (the replay included) before its events are dropped and counted. */
  readonly subscriberBufferBytes: number;
  /** Followers at once; one more is refused with 503. */
  readonly maxSubscribers: number;
  readonly now?: () => Date;
}

export const NDJSON = 'application/x-ndjson';

/** The query of GET /events: ?type=credential.*,pod.indexed&namespace=shop&pod=reader&follow=false&backlog=true */
const FeedQuery = z.object({
  type: z
    .string()
    .optional()
    .transform((text, ctx) => {
      if (text === undefined || text.trim() === '') return undefined;
      const types = new Set<AuditEventType>();
      for (const pattern of text
        .split(',')
        .map((part) => part.trim())
        .filter(Boolean)) {
        const matched = typesMatching(pattern);
        if (matched.length === 0)
          ctx.addIssue({
            code: 'custom',
            message: `type "${pattern}" matches no event type (known: ${AUDIT_EVENT_TYPES.join(', ')}; a trailing * matches a prefix)`,
          });
        for (const type of matched) types.add(type);
      }
      return types;
    }),
  namespace: z.string().min(1).optional(),
  pod: z.string().min(1).optional(),
  follow: z
    .enum(['true', 'false'])
    .default('true')
    .transform((value) => value === 'true'),
  /** With follow: the buffered events first (as `kubectl logs -f` does), rather than only new ones. */
  backlog: z
    .enum(['true', 'false'])
    .default('false')
    .transform((value) => value === 'true'),
});
type Filter = z.output<typeof FeedQuery>;

/** `credential.issued` exactly; `credential.*` (or `credential*`) every type with that prefix. */
export function typesMatching(pattern: string): AuditEventType[] {
  if (!pattern.endsWith('*')) return AUDIT_EVENT_TYPES.filter((type) => type === pattern);
  const prefix = pattern.slice(0, -1);
  return AUDIT_EVENT_TYPES.filter((type) => type.startsWith(prefix));
}

const matches = (filter: Filter, event: AuditEvent): boolean =>
  (filter.type === undefined || filter.type.has(event.type)) &&
  (filter.namespace === undefined || event.namespace === filter.namespace) &&
  (filter.pod === undefined || event.pod === filter.pod);

/** A fixed-size buffer of the newest items, oldest first. */
class Ring<T> {
  private readonly items: T[] = [];
  private start = 0;

  constructor(private readonly capacity: number) {}

  push(item: T): void {
    if (this.capacity === 0) return;
    if (this.items.length < this.capacity) this.items.push(item);
    else {
      this.items[this.start] = item;
      this.start = (this.start + 1) % this.capacity;
    }
  }

  get size(): number {
    return this.items.length;
  }

  /** The item at a position, 0 being the oldest. */
  at(position: number): T | undefined {
    return this.items[(this.start + position) % this.items.length];
  }
}

/** The SSE framing: `id:` the event id, `event:` its type, `data:` the JSON. A gap has no id, so a resume after it re-fetches what it missed. */
const sseMessage = (message: AuditEvent | StreamGap): string =>
  `${'id' in message ? `id: ${message.id}\n` : ''}event: ${message.type}\ndata: ${JSON.stringify(message)}\n\n`;
const ndjsonLine = (message: AuditEvent | StreamGap): string => `${JSON.stringify(message)}\n`;

export class EventFeed {
  private readonly recent: Ring<AuditEvent>;
  private readonly subscription: Subscription;
  private readonly closers = new Set<() => void>();
  /** The first id of this run: an older Last-Event-ID comes from a previous run of the agent. */
  private firstIdOfRun: number | undefined;
  private readonly now: () => Date;

  constructor(private readonly options: EventFeedOptions) {
    this.now = options.now ?? (() => new Date());
    this.recent = new Ring(options.bufferSize);
    this.subscription = options.events$.subscribe((event) => {
      this.firstIdOfRun ??= event.id;
      this.recent.push(event);
    });
  }

  /** The GET /events handler. */
  readonly handle = (req: IncomingMessage, res: ServerResponse): void => {
    const query = FeedQuery.safeParse(Object.fromEntries(new URL(req.url ?? '/', 'http://admin').searchParams));
    if (!query.success) {
      const text = JSON.stringify({ error: query.error.issues.map((issue) => issue.message).join('; ') });
      res.writeHead(400, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
      return void res.end(text);
    }
    const filter = query.data;
    // A one-shot read counts too until its client has read it: its replay is queued for it meanwhile.
    if (this.closers.size >= this.options.maxSubscribers) {
      const text = JSON.stringify({
        error: `${this.options.maxSubscribers} subscribers already read /events (BROKER_EVENTS_MAX_SUBSCRIBERS)`,
      });
      res.writeHead(503, {
        'Content-Type': 'application/json',
        'Content-Length': Buffer.byteLength(text),
        'Retry-After': '5',
      });
      return void res.end(text);
    }
    const ndjson = (req.headers.accept ?? '').includes(NDJSON);
    const format = ndjson ? ndjsonLine : sseMessage;
    res.writeHead(200, {
      'Content-Type': ndjson ? NDJSON : 'text/event-stream',
      'Cache-Control': 'no-cache',
      'X-Accel-Buffering': 'no',
    });
    if (req.method === 'HEAD') return void res.end();

    let missed: { count: number; firstId: number; lastId: number } | undefined;
    // 'drain' only follows a write that returned false, i.e. a queue at the stream's high-water mark
    // (16 KiB up to Node 20, 64 KiB since Node 22): a smaller configured limit is raised to it.
    const queueLimit = Math.max(this.options.subscriberBufferBytes, res.writableHighWaterMark);
    const writeGap = (gap: Omit<StreamGap, 'v' | 'type' | 'time'>) =>
      res.write(format({ v: AUDIT_SCHEMA_VERSION, type: 'stream.gap', time: this.now().toISOString(), ...gap }));
    const deliver = (event: AuditEvent) => {
      // Between a client going away and the response's 'close', writes would only raise errors.
      if (res.destroyed || !matches(filter, event)) return;
      // The queue limit is at least the stream's high-water mark, so reaching it means a write returned false and 'drain' will come.
      if (missed || res.writableLength >= queueLimit) {
        missed = { count: (missed?.count ?? 0) + 1, firstId: missed?.firstId ?? event.id, lastId: event.id };
        return;
      }
      res.write(format(event));
    };
    const reportMissed = () => {
      if (!missed) return;
      const { count, firstId, lastId } = missed;
      missed = undefined;
      writeGap({ reason: 'subscriber-too-slow', dropped: count, firstId, lastId });
    };
    res.on('drain', reportMissed);
    let live: Subscription | undefined;
    let heartbeat: NodeJS.Timeout | undefined;
    const close = () => {
      live?.unsubscribe();
      clearInterval(heartbeat);
      this.closers.delete(close);
      res.end();
    };
    this.closers.add(close);
    res.on('close', close);
    // NDJSON has no comments: a blank line keeps the connection visibly alive and parsers skip it.
    // A subscriber that reads nothing gets no heartbeats beyond its limit either.
    const startHeartbeat = () => {
      heartbeat = setInterval(() => {
        if (!missed && !res.destroyed && res.writableLength < queueLimit) res.write(ndjson ? '\n' : ': heartbeat\n\n');
      }, this.options.heartbeatMs);
    };

    /**
     * The buffered events after `cursor` (all of them when undefined), written at the pace the
     * subscriber reads: whenever its limit is queued, the replay waits for 'drain' and goes on
     * from the buffer as it is then. Events evicted meanwhile are counted in a gap.
     */
    const replay = (cursor: number | undefined, done: () => void) => {
      if (res.destroyed) return;
      const evicted = cursor === undefined ? 0 : this.evictedSince(cursor);
      if (evicted > 0) writeGap({ reason: 'not-buffered', dropped: evicted });
      for (let position = this.positionAfter(cursor); position < this.recent.size; position += 1) {
        if (res.writableLength >= queueLimit) return void res.once('drain', () => replay(cursor, done));
        const event = this.recent.at(position) as AuditEvent;
        cursor = event.id;
        if (matches(filter, event)) res.write(format(event));
      }
      done();
    };
    const follow = () => {
      if (!filter.follow) return void res.end();
      if (!ndjson) res.write('retry: 2000\n\n');
      // Subscribed in the same tick the replay caught up with the buffer: nothing published falls between.
      live = this.options.events$.subscribe(deliver);
      startHeartbeat();
    };
    const resumeAfter = lastEventId(req);
    if (resumeAfter === undefined && filter.follow && !filter.backlog) follow();
    else replay(resumeAfter, follow);
  };

  /** The buffer position of the first event after `cursor`: 0 when undefined or older than the buffer. */
  private positionAfter(cursor: number | undefined): number {
    const oldest = this.recent.at(0)?.id;
    if (cursor === undefined || oldest === undefined) return 0;
    return Math.min(this.recent.size, Math.max(0, cursor + 1 - oldest));
  }

  /**
   * How many events of this run after `resumeAfter` are no longer buffered. An id from a previous
   * run counts every event of this run that fell out of the buffer.
   */
  private evictedSince(resumeAfter: number): number {
    const oldest = this.recent.at(0)?.id;
    if (this.firstIdOfRun === undefined || oldest === undefined) return 0;
    return Math.max(0, oldest - Math.max(resumeAfter + 1, this.firstIdOfRun));
  }

  /** Ends every subscriber's response (at shutdown, so the admin server can close at once). */
  close(): void {
    for (const close of [...this.closers]) close();
    this.subscription.unsubscribe();
  }
}

function lastEventId(req: IncomingMessage): number | undefined {
  const header = req.headers['last-event-id'];
  const text = Array.isArray(header) ? header[0] : header;
  return text !== undefined && /^\d{1,16}$/.test(text.trim()) ? Number(text.trim()) : undefined;
}
