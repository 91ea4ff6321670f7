/**
 * Watches as the API server streams them: chunked JSON, one event per line, replayed from a
 * resourceVersion, filtered by a selector, and ended the ways a real watch ends (timeout, compaction,
 * a cut connection).
 */
import type { ServerResponse } from 'node:http';
import { withResourceVersion } from './objects.js';
import type { Predicate } from './selectors.js';
import { ApiError, statusBody } from './status.js';
import type { Change, ChangeType, ObjectStore, StoredResource } from './store.js';

interface WatchEvent {
  type: ChangeType | 'ERROR' | 'BOOKMARK';
  object: unknown;
}

interface Watcher {
  resource: string;
  matches: Predicate;
  /** Only changes newer than this are sent (the watch's resourceVersion). */
  since: number;
  res: ServerResponse;
}

export class Watches {
  private readonly watchers = new Set<Watcher>();

  constructor(private readonly store: ObjectStore) {
    store.onChange((change) => {
      for (const watcher of this.watchers) deliver(watcher, change);
    });
  }

  /** Takes over the response: headers now, then the replayed and the new changes the selection sees. */
  open(res: ServerResponse, query: URLSearchParams, resource: StoredResource, matches: Predicate): void {
    const requested = parseResourceVersion(query.get('resourceVersion'));
    res.writeHead(200, {
      'Content-Type': 'application/json',
      'Transfer-Encoding': 'chunked',
      'Cache-Control': 'no-cache',
    });
    // Clients consider the watch established once headers arrive; don't wait for the first event.
    res.flushHeaders();
    if (requested !== undefined && requested <= this.store.expiredThrough) {
      expire(res);
      return;
    }
    const watcher: Watcher = { resource: resource.name, matches, since: requested ?? this.store.resourceVersion, res };
    for (const change of this.store.history) deliver(watcher, change);
    this.watchers.add(watcher);
    const timeout = watchTimeoutMs(query);
    // As kube-apiserver's watch cache does for clients that allow bookmarks: the resourceVersion
    // the watch has reached, sent just before it ends at its timeout, so the next watch resumes
    // from there even when nothing this watch selects changed (a quiet node's pods).
    const bookmarks = query.get('allowWatchBookmarks') === 'true';
    const end = () => {
      if (bookmarks) writeEvent(res, bookmark(resource, this.store.resourceVersion));
      res.end();
    };
    const timer = timeout === undefined ? undefined : setTimeout(end, timeout);
    res.once('close', () => {
      clearTimeout(timer);
      this.watchers.delete(watcher);
    });
  }

  /** Destroys every watch socket mid-stream, as a network cut would. */
  dropAll(): void {
    for (const watcher of this.watchers) watcher.res.destroy();
  }

  /** Ends every watch with a proper final chunk, as the API server's watch timeout does. */
  endAll(): void {
    for (const watcher of this.watchers) watcher.res.end();
  }

  /** After a compaction: every open watch learns that its resourceVersion is gone. */
  expireAll(): void {
    for (const watcher of this.watchers) expire(watcher.res);
  }
}

export function isWatchRequest(query: URLSearchParams): boolean {
  const watch = query.get('watch');
  return watch === 'true' || watch === '1';
}

/** Real API servers answer a too-old watch with HTTP 200 and an in-stream 410, then close. */
function expire(res: ServerResponse): void {
  writeEvent(res, { type: 'ERROR', object: statusBody(410, 'too old resource version') });
  res.end();
}

function bookmark(resource: StoredResource, resourceVersion: number): WatchEvent {
  return {
    type: 'BOOKMARK',
    object: { kind: resource.kind, apiVersion: 'v1', metadata: { resourceVersion: String(resourceVersion) } },
  };
}

function deliver(watcher: Watcher, change: Change): void {
  if (change.resource !== watcher.resource || change.rv <= watcher.since) return;
  const event = eventForWatcher(change, watcher.matches);
  if (event) writeEvent(watcher.res, event);
}

/**
 * Translates a change into what a selector-filtered watch sees, as the real
 * watch cache does: an object moving into the selection is ADDED, one moving
 * out of it is DELETED (its last matching state at the new resourceVersion).
 */
function eventForWatcher(change: Change, matches: Predicate): WatchEvent | undefined {
  const matchesNow = matches(change.object);
  if (change.type !== 'MODIFIED') return matchesNow ? { type: change.type, object: change.object } : undefined;
  const matchedBefore = change.previous !== undefined && matches(change.previous);
  if (matchesNow) return { type: matchedBefore ? 'MODIFIED' : 'ADDED', object: change.object };
  if (!matchedBefore) return undefined;
  return { type: 'DELETED', object: withResourceVersion(change.previous, change.rv) };
}

function writeEvent(res: ServerResponse, event: WatchEvent): void {
  if (!res.writableEnded) res.write(`${JSON.stringify(event)}\n`);
}

/** "", "0" or absent (undefined) mean "from now": such a watch can never be too old. */
function parseResourceVersion(value: string | null): number | undefined {
  if (value === null || value === '' || value === '0') return undefined;
  if (!/^\d+$/.test(value)) throw new ApiError(400, `invalid resource version: ${value}`);
  return Number(value);
}

function watchTimeoutMs(query: URLSearchParams): number | undefined {
  const value = query.get('timeoutSeconds');
  if (value === null) return undefined;
  const seconds = Number(value);
  if (!Number.isFinite(seconds) || seconds < 0) throw new ApiError(400, `invalid timeoutSeconds: ${value}`);
  return seconds * 1000;
}
