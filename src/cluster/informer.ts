/**
 * A Kubernetes list+watch as an Observable of events, restarted after failures.
 *
 * @kubernetes/client-node 1.4's ListWatch relists by itself after a 410 and re-watches after a
 * clean end of stream, but stops for good on any other error (a cut socket, HTTP 500, a refused
 * connection). This wrapper restarts it with capped, jittered backoff, keeping its object cache
 * so that the relist after an outage reports the objects that disappeared meanwhile as deletes.
 */
// client-node's own modules, not its index: the index loads the whole generated API client (see kube-connection.ts).
import { ListWatch } from '@kubernetes/client-node/dist/cache.js';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import type { KubernetesListObject, KubernetesObject } from '@kubernetes/client-node/dist/types.js';
import { Watch } from '@kubernetes/client-node/dist/watch.js';
import { Observable } from 'rxjs';
import type { z } from 'zod';
import { type Backoff, retryDelayMs } from '../backoff.js';
import { type KubeConnection, watchConfig } from './kube-connection.js';

export type InformerEvent<T> =
  | { readonly type: 'upsert'; readonly object: T }
  | { readonly type: 'delete'; readonly object: T }
  /** A list completed: everything the API server has was upserted, everything gone was deleted. */
  | { readonly type: 'synced' }
  /** A watch stream is open: changes from now on arrive as they happen. */
  | { readonly type: 'watching' }
  | { readonly type: 'disconnected'; readonly error: string; readonly retryInMs: number }
  | { readonly type: 'invalid'; readonly reason: string };

export interface InformerSpec<T> {
  readonly kube: KubeConnection;
  /** API path, e.g. /api/v1/pods. */
  readonly path: string;
  readonly list: () => Promise<KubernetesListObject<KubernetesObject>>;
  readonly fieldSelector?: string;
  /** Validates and narrows each object: the rest of the agent only sees what passed. */
  readonly parse: (raw: unknown) => z.ZodSafeParseResult<T>;
  /**
   * Keeps only what the agent reads of each object, before ListWatch caches it: a pod carries far
   * more (container specs, managed fields, last-applied annotations) than the agent needs.
   */
  readonly slim?: (raw: KubernetesObject) => KubernetesObject;
  readonly backoff?: Backoff;
  readonly watchTimeout?: WatchTimeout;
}

/**
 * How long one watch request may live. The API server ends it cleanly after serverSeconds and the
 * informer re-watches from where it was; a watch still open graceMs after that is a connection
 * that died without a FIN or RST (a partitioned API server), and is aborted so that the informer
 * reports itself disconnected and reconnects instead of waiting for events that never come.
 */
export interface WatchTimeout {
  readonly serverSeconds: number;
  readonly graceMs: number;
}

/**
 * A watch that dies silently is noticed at most deadlineSeconds after it did: each watch asks the
 * server to end it after five sixths of the deadline and is abandoned at the deadline. Of the ways
 * to notice a dead stream this is the only one that bounds it below a minute everywhere: TCP
 * keepalive probes only start after the connection has been idle (and Node sets only their initial
 * delay, not the kernel's 75 s × 9 probes), and the API server sends bookmarks about once a minute, when at all.
 * A renewed watch resumes from the last resourceVersion (kept current by bookmarks), from the API
 * server's watch cache.
 */
export function watchTimeoutWithin(deadlineSeconds: number): WatchTimeout {
  const serverSeconds = Math.max(1, Math.floor((deadlineSeconds * 5) / 6));
  return { serverSeconds, graceMs: Math.max(500, deadlineSeconds * 1000 - serverSeconds * 1000) };
}

/** Short on purpose: the agent must catch up within about a second of the API server returning. */
const DEFAULT_BACKOFF: Backoff = { initialMs: 100, maxMs: 1000 };
/** The agent's default (BROKER_WATCH_DEADLINE): how stale its index may be before it says so. */
export const DEFAULT_WATCH_DEADLINE_SECONDS = 30;

export function informerEvents<T>(spec: InformerSpec<T>): Observable<InformerEvent<T>> {
  return new Observable<InformerEvent<T>>((subscriber) => {
    const backoff = spec.backoff ?? DEFAULT_BACKOFF;
    let failures = 0;
    let restartTimer: NodeJS.Timeout | undefined;
    let stopped = false;

    const emitObject = (type: 'upsert' | 'delete') => (raw: KubernetesObject) => {
      const parsed = spec.parse(raw);
      if (parsed.success) subscriber.next({ type, object: parsed.data });
      else
        subscriber.next({
          type: 'invalid',
          reason: `${describe(raw)}: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`,
        });
    };

    // ListWatch applies a list's results synchronously right after listFn resolves, so an
    // immediate callback scheduled then runs after the last upsert of that list.
    const slim = spec.slim ?? ((raw: KubernetesObject) => raw);
    const listThenMarkSynced = async () => {
      const list = await spec.list();
      list.items = list.items.map(slim);
      setImmediate(() => {
        if (!stopped) subscriber.next({ type: 'synced' });
      });
      return list;
    };

    const onWatching = () => {
      failures = 0;
      subscriber.next({ type: 'watching' });
    };
    const watch = new ObservedWatch(
      spec.kube,
      spec.watchTimeout ?? watchTimeoutWithin(DEFAULT_WATCH_DEADLINE_SECONDS),
      onWatching,
      slim,
    );
    const listWatch = new ListWatch(spec.path, watch, listThenMarkSynced, false, undefined, spec.fieldSelector);
    listWatch.on('add', emitObject('upsert'));
    listWatch.on('update', emitObject('upsert'));
    listWatch.on('delete', emitObject('delete'));
    const restartLater = (error: unknown) => {
      if (stopped) return;
      const retryInMs = retryDelayMs(failures++, backoff);
      subscriber.next({ type: 'disconnected', error: errorText(error), retryInMs });
      restartTimer = setTimeout(start, retryInMs);
    };
    listWatch.on('error', restartLater);
    function start() {
      if (!stopped) listWatch.start().catch(restartLater);
    }
    start();

    return () => {
      stopped = true;
      clearTimeout(restartTimer);
      void listWatch.stop();
    };
  });
}

/**
 * A Watch that reports when the API server has accepted the stream (HTTP 200), which ListWatch
 * does not, and that bounds the stream's life (see WatchTimeout).
 */
class ObservedWatch extends Watch {
  constructor(
    kube: KubeConnection,
    private readonly timeout: WatchTimeout,
    private readonly onEstablished: () => void,
    private readonly slim: (raw: KubernetesObject) => KubernetesObject,
  ) {
    // Watch reads only getCurrentCluster() and applyToFetchOptions() of its KubeConfig.
    super(watchConfig(kube) as unknown as KubeConfig);
  }

  override async watch(...args: Parameters<Watch['watch']>): ReturnType<Watch['watch']> {
    const [path, query, callback, done] = args;
    let ended = false;
    let expired = false;
    let deadline: NodeJS.Timeout | undefined;
    const deadlineMs = this.timeout.serverSeconds * 1000 + this.timeout.graceMs;
    // ERROR events carry a Status (its code, 410, is what ListWatch reads): only objects are slimmed.
    const slimmed = (phase: string, object: KubernetesObject, event: unknown) =>
      callback(phase, phase === 'ERROR' ? object : this.slim(object), event);
    // Bookmarks carry the resourceVersion a quiet watch has reached, so renewing it every few
    // seconds resumes from there instead of from an old version the API server may have compacted.
    const controller = await super.watch(
      path,
      { ...query, timeoutSeconds: this.timeout.serverSeconds, allowWatchBookmarks: true },
      slimmed,
      (error) => {
        ended = true;
        clearTimeout(deadline);
        done(
          expired
            ? new Error(
                `the watch stream outlived its ${deadlineMs} ms deadline without ending: the API server is unreachable`,
              )
            : error,
        );
      },
    );
    if (!ended) {
      // Aborting fails the stream, so ListWatch reports an error and the informer restarts it.
      deadline = setTimeout(() => {
        expired = true;
        controller.abort();
      }, deadlineMs);
      deadline.unref();
      this.onEstablished();
    }
    return controller;
  }
}

/** The metadata ListWatch and the agent need of every object. */
const METADATA_KEPT = ['name', 'namespace', 'uid', 'resourceVersion', 'creationTimestamp'] as const;

/**
 * A slimmer for InformerSpec.slim: keeps the named fields of the named top-level sections, the
 * identifying metadata, and the annotations the agent reads (all of them when annotationKeys is undefined).
 */
export function keepFields(
  sections: Readonly<Record<string, readonly string[]>>,
  annotationKeys?: readonly string[],
): (raw: KubernetesObject) => KubernetesObject {
  const pick = (from: Record<string, unknown> | undefined, keys: readonly string[]) =>
    from === undefined || from === null
      ? from
      : Object.fromEntries(keys.filter((key) => from[key] !== undefined).map((key) => [key, from[key]]));
  return (raw) => {
    const source = raw as unknown as Record<string, Record<string, unknown> | undefined>;
    const annotations = raw.metadata?.annotations;
    const slimmed: Record<string, unknown> = {
      kind: raw.kind,
      metadata: {
        ...pick(raw.metadata as Record<string, unknown> | undefined, METADATA_KEPT),
        ...(annotations ? { annotations: annotationKeys ? pick(annotations, annotationKeys) : annotations } : {}),
      },
    };
    for (const [section, keys] of Object.entries(sections)) slimmed[section] = pick(source[section], keys);
    return slimmed;
  };
}

function describe(raw: KubernetesObject): string {
  return `${raw?.kind ?? 'object'} ${raw?.metadata?.namespace ? `${raw.metadata.namespace}/` : ''}${raw?.metadata?.name ?? '(unnamed)'}`;
}

function errorText(error: unknown): string {
  if (error instanceof Error) {
    const status =
      (error as { statusCode?: number; code?: number | string }).statusCode ??
      (error as { code?: number | string }).code;
    return status !== undefined ? `${error.message} (${status})` : error.message;
  }
  return String(error);
}
