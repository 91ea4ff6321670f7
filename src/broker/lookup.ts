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
import type { ServiceAccountRecord } from '../cluster/service-accounts.js';
import { type IndexKey, type IndexView, ipKey, namespaceKey } from './pod-index.js';

export interface LookupOptions {
  /** How long this request waits for its pod. */
  readonly holdMs: number;
  /** The caller's namespace must be known too (namespace restrictions read its annotations). */
  readonly needsNamespace: boolean;
  readonly scheduler?: SchedulerLike;
}

/** What the role policy reads about a known pod, whichever door it came through. */
export interface PodContext {
  readonly pod: PodRecord;
  readonly namespace: NamespaceRecord | undefined;
  readonly serviceAccount: ServiceAccountRecord | undefined;
  /** Until the ServiceAccount informer has listed once, a missing ServiceAccount may be one not seen yet. */
  readonly serviceAccountsSynced: boolean;
}

export const podContext = (view: IndexView, pod: PodRecord): PodContext => ({
  pod,
  namespace: view.namespace(pod.namespace),
  serviceAccount: view.serviceAccount(pod.namespace, pod.serviceAccount),
  serviceAccountsSynced: view.health('serviceaccounts').synced,
});

export type Decision =
  ({ readonly kind: 'found' } & PodContext) | { readonly kind: 'waiting'; readonly on: readonly IndexKey[] };

export type LookupOutcome =
  | (PodContext & {
      readonly kind: 'found';
      /** index: known at once; push: an informer event resolved the wait. */
      readonly resolvedBy: 'index' | 'push';
      readonly waitedMs: number;
    })
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
  const context = podContext(view, pod);
  // Waiting on the IP too: the pod may lose the IP (deleted, replaced) while its namespace is awaited.
  if (needsNamespace && !context.namespace) return { kind: 'waiting', on: [ipKey(ip), namespaceKey(pod.namespace)] };
  return { kind: 'found', ...context };
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
          return of<LookupOutcome>({
            kind: 'timeout',
            waitedMs: scheduler.now() - startedAt,
            podsAwaitingIp: index.view.podsAwaitingIp(),
            missing,
            ...(pod ? { pod } : {}),
          });
        },
      }),
    );
  });
}
