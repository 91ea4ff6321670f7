import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { describe, it } from 'node:test';
import { AuditStream } from '../../src/audit/events.js';
import { EventFeed } from '../../src/audit/sse.js';
import { StreamMessageSchema } from '../../src/audit/stream-message.js';

/** A response whose client reads only when told to: what is written stays queued (writableLength) until read(). */
class HeldResponse extends EventEmitter {
  /** As a real response's: the feed never queues less than this for a subscriber. */
  readonly writableHighWaterMark = 16_384;
  writableLength = 0;
  destroyed = false;
  ended = false;
  status = 0;
  readonly received: string[] = [];
  private readonly queued: string[] = [];
  writeHead(status: number) {
    this.status = status;
    return this;
  }
  setHeader() {}
  write(chunk: string) {
    this.queued.push(chunk);
    this.writableLength += chunk.length;
    return false;
  }
  end(chunk?: string) {
    if (chunk) this.write(chunk);
    this.ended = true;
  }
  /** The client reads everything queued; the stream drains. */
  read() {
    this.received.push(...this.queued.splice(0));
    this.writableLength = 0;
    this.emit('drain');
  }
  messages() {
    return this.received
      .join('')
      .split('\n')
      .filter(Boolean)
      .map((line) => StreamMessageSchema.parse(JSON.parse(line)));
  }
}

const request = (url: string) =>
  ({ url, headers: { accept: 'application/x-ndjson' }, method: 'GET' }) as unknown as IncomingMessage;
const LIMIT = 16_384;

function feedWith(events: number, maxSubscribers = 4) {
  const audit = new AuditStream();
  const feed = new EventFeed({
    events$: audit.events$,
    bufferSize: 10_000,
    heartbeatMs: 60_000,
    subscriberBufferBytes: LIMIT,
    maxSubscribers,
  });
  for (let i = 0; i < events; i += 1) audit.publish({ type: 'token.issued', podIp: '10.0.0.1', ttlSeconds: 60 });
  return { audit, feed };
}

describe('/events replay and subscriber cap', () => {
  it('replays the backlog at the pace the subscriber reads, never queueing more than its limit, and misses nothing', () => {
    const { feed } = feedWith(2_000);
    const res = new HeldResponse();
    feed.handle(request('/events?follow=false'), res as unknown as ServerResponse);
    let mostQueued = 0;
    for (let reads = 0; !res.ended && reads < 1_000; reads += 1) {
      mostQueued = Math.max(mostQueued, res.writableLength);
      res.read();
    }
    res.read();
    assert.ok(mostQueued < LIMIT + 1_024, `at most the limit plus one event queued, was ${mostQueued}`);
    const ids = res.messages().map((message) => ('id' in message ? message.id : 0));
    assert.equal(ids.length, 2_000);
    assert.deepEqual(
      ids,
      [...ids].sort((a, b) => a - b),
    );
    feed.close();
  });

  it('a follower that never reads holds at most its limit, backlog and live events alike', () => {
    const { audit, feed } = feedWith(2_000);
    const res = new HeldResponse();
    feed.handle(request('/events?backlog=true'), res as unknown as ServerResponse);
    // Closed even when the assertion fails: the follower's heartbeat timer would keep the test process alive.
    try {
      for (let i = 0; i < 2_000; i += 1) audit.publish({ type: 'token.issued', podIp: '10.0.0.1', ttlSeconds: 60 });
      assert.ok(res.writableLength < LIMIT + 1_024, `queued ${res.writableLength} bytes`);
    } finally {
      feed.close();
    }
  });

  it('refuses one subscriber more than the cap with 503 and Retry-After, and takes one again when a subscriber leaves', () => {
    const { feed } = feedWith(0, 2);
    const held = [new HeldResponse(), new HeldResponse()];
    for (const res of held) feed.handle(request('/events'), res as unknown as ServerResponse);
    const refused = new HeldResponse();
    feed.handle(request('/events'), refused as unknown as ServerResponse);
    assert.equal(refused.status, 503);
    held[0]?.emit('close');
    const next = new HeldResponse();
    feed.handle(request('/events'), next as unknown as ServerResponse);
    assert.equal(next.status, 200);
    feed.close();
  });
});
