/**
 * The heart of the agent: "which pod is this IP, now or when its pod appears".
 *
 * A lookup is a subscription on the live index keyed by the caller's IP. A known IP answers at
 * once. An unknown one waits, and the informer event that brings its pod resolves it inside that
 * event's handler, with no polling. The request's hold (chosen by its caller) bounds the wait;
 * unsubscribing (the client went away) removes the waiter.
 */
import { type Observable, type SchedulerLike, asyncScheduler, defer, map, of, switchMap, take, timeout } from 'rxjs';
import type { NamespaceRecord } from '../cluster/namespaces.js';
import type { PodRecord } from '../cluster/pods.js';
import { type IndexKey, type IndexView, ipKey, namespaceKey } from './pod-index.js';

export interface LookupOptions {
  /** How long this request waits for its pod. */
  readonly holdMs: number;
  /** The caller's namespace must be known too (namespace restrictions read its annotations). */
  readonly needsNamespace: boolean;
  readonly scheduler?: SchedulerLike;
}

export type Decision =
  | { readonly kind: 'found'; readonly pod: PodRecord; readonly namespace: NamespaceRecord | undefined }
  | { readonly kind: 'waiting'; readonly on: readonly IndexKey[] };

export type LookupOutcome =
  | {
      readonly kind: 'found';
      readonly pod: PodRecord;
      readonly namespace: NamespaceRecord | undefined;
      /** index: known at once; push: an informer event resolved the wait. */
      readonly resolvedBy: 'index' | 'push';
      readonly waitedMs: number;
    }
  | {
      readonly kind: 'timeout';
      readonly waitedMs: number;
      readonly podsAwaitingIp: number;
      readonly missing: 'pod' | 'namespace';
      /** The caller's pod when only its namespace was missing. */
      readonly pod?: PodRecord;
    };

export type FoundOutcome = Extract<LookupOutcome, { kind: 'found' }>;
export type TimeoutOutcome = Extract<LookupOutcome, { kind: 'timeout' }>;

/** The decision for one IP in one state of the index. Pure. */
export function decide(view: IndexView, ip: string, needsNamespace: boolean): Decision {
  const pod = view.ownerOf(ip);
  if (!pod) return { kind: 'waiting', on: [ipKey(ip)] };
  const namespace = view.namespace(pod.namespace);
  // Waiting on the IP too: the pod may lose the IP (deleted, replaced) while its namespace is awaited.
  if (needsNamespace && !namespace) return { kind: 'waiting', on: [ipKey(ip), namespaceKey(pod.namespace)] };
  return { kind: 'found', pod, namespace };
}

export interface LiveIndex {
  readonly view: IndexView;
  changes(keys: readonly IndexKey[]): Observable<void>;
}

export function lookup(index: LiveIndex, ip: string, options: LookupOptions): Observable<LookupOutcome> {
  const scheduler = options.scheduler ?? asyncScheduler;
  return defer(() => {
    const startedAt = scheduler.now();
    const first = decide(index.view, ip, options.needsNamespace);
    if (first.kind === 'found') return of<LookupOutcome>({ ...first, resolvedBy: 'index', waitedMs: 0 });

    const untilFound = (decision: Decision): Observable<Decision & { kind: 'found' }> =>
      decision.kind === 'found'
        ? of(decision)
        : index.changes(decision.on).pipe(
            take(1),
            switchMap(() => untilFound(decide(index.view, ip, options.needsNamespace))),
          );

    return untilFound(first).pipe(
      map((found): LookupOutcome => ({ ...found, resolvedBy: 'push', waitedMs: scheduler.now() - startedAt })),
      timeout({
        first: options.holdMs,
        scheduler,
        with: () => {
          const last = decide(index.view, ip, options.needsNamespace);
          const missing = last.kind === 'waiting' && last.on.length > 1 ? 'namespace' : 'pod';
          const pod = missing === 'namespace' ? index.view.ownerOf(ip) : undefined;
          return of<LookupOutcome>({ kind: 'timeout', waitedMs: scheduler.now() - startedAt, podsAwaitingIp: index.view.podsAwaitingIp(), missing, ...(pod ? { pod } : {}) });
        },
      }),
    );
  });
}
