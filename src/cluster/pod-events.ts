/**
 * Kubernetes Events on pods, as kiam records them: a pod whose role is refused gets a Warning
 * Event (reason RoleDenied), so `kubectl describe pod` shows why its SDK gets 403. Best effort:
 * when RBAC forbids creating Events, that is logged once and the agent carries on.
 */
import type { Logger } from 'pino';
import { type Observable, type Subscription, filter } from 'rxjs';
import type { AuditEvent } from '../audit/events.js';
import type { IndexView } from '../broker/pod-index.js';
import { KubeApiError, type KubeConnection, kubeRequest } from './kube-connection.js';

export interface EventTarget {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string | undefined;
}

/** The core/v1 Event the agent posts (the fields it sets). */
export interface PodEvent {
  readonly metadata: { readonly generateName: string; readonly namespace: string };
  readonly involvedObject: {
    readonly apiVersion: 'v1';
    readonly kind: 'Pod';
    readonly namespace: string;
    readonly name: string;
    readonly uid?: string;
  };
  readonly reason: string;
  readonly message: string;
  readonly type: 'Warning';
  readonly source: { readonly component: string; readonly host?: string };
  readonly reportingComponent: string;
  readonly reportingInstance?: string;
  readonly firstTimestamp: string;
  readonly lastTimestamp: string;
  readonly count: number;
}

export interface PodEventRecorderOptions {
  readonly createEvent: (namespace: string, body: PodEvent) => Promise<unknown>;
  readonly logger: Logger;
  /** The node the agent runs on, shown as the Event's source host. */
  readonly host: string | undefined;
  readonly now?: () => number;
}

export const ROLE_DENIED_REASON = 'RoleDenied';
/** A pod retrying a denied request gets one Event per reason in this window, not one per request. */
const REPEAT_WINDOW_MS = 60_000;
const MAX_REMEMBERED = 10_000;
const COMPONENT = 'kube-iam-broker';

export class PodEventRecorder {
  private readonly lastPosted = new Map<string, number>();
  private forbiddenReported = false;
  private readonly now: () => number;

  constructor(private readonly options: PodEventRecorderOptions) {
    this.now = options.now ?? Date.now;
  }

  /** Posts a Warning Event on the pod unless the same one was posted within the repeat window. Never throws. */
  warn(target: EventTarget, reason: string, message: string): void {
    const key = `${target.namespace}/${target.name}/${target.uid ?? ''}/${reason}/${message}`;
    const now = this.now();
    const last = this.lastPosted.get(key);
    if (last !== undefined && now - last < REPEAT_WINDOW_MS) return;
    this.remember(key, now);
    const time = new Date(now).toISOString();
    const body: PodEvent = {
      metadata: { generateName: `${target.name}.`, namespace: target.namespace },
      involvedObject: {
        apiVersion: 'v1',
        kind: 'Pod',
        namespace: target.namespace,
        name: target.name,
        ...(target.uid ? { uid: target.uid } : {}),
      },
      reason,
      message,
      type: 'Warning',
      source: { component: COMPONENT, ...(this.options.host ? { host: this.options.host } : {}) },
      reportingComponent: COMPONENT,
      ...(this.options.host ? { reportingInstance: this.options.host } : {}),
      firstTimestamp: time,
      lastTimestamp: time,
      count: 1,
    };
    this.options.createEvent(target.namespace, body).catch((error: unknown) => this.failed(error, target));
  }

  private remember(key: string, now: number): void {
    if (this.lastPosted.size >= MAX_REMEMBERED) {
      for (const [old, at] of this.lastPosted) if (now - at >= REPEAT_WINDOW_MS) this.lastPosted.delete(old);
      if (this.lastPosted.size >= MAX_REMEMBERED) this.lastPosted.clear();
    }
    this.lastPosted.set(key, now);
  }

  private failed(error: unknown, target: EventTarget): void {
    if (error instanceof KubeApiError && error.statusCode === 403) {
      if (!this.forbiddenReported) {
        this.forbiddenReported = true;
        this.options.logger.warn(
          { namespace: target.namespace },
          'not allowed to create Events (RBAC: create events); denials are logged but not recorded on pods',
        );
      }
      return;
    }
    this.options.logger.debug(
      { namespace: target.namespace, pod: target.name, err: String(error) },
      'could not record an Event on the pod',
    );
  }
}

export function podEventRecorder(kube: KubeConnection, logger: Logger, host: string | undefined): PodEventRecorder {
  const createEvent = (namespace: string, body: PodEvent) =>
    kubeRequest(kube, `/api/v1/namespaces/${encodeURIComponent(namespace)}/events`, { method: 'POST', body });
  return new PodEventRecorder({ createEvent, logger, host });
}

/** Records every 403 the metadata server gives a known pod as a RoleDenied Event on that pod. */
export function recordRoleDenials(
  events$: Observable<AuditEvent>,
  index: IndexView,
  recorder: PodEventRecorder,
): Subscription {
  return events$
    .pipe(
      filter(
        (event): event is Extract<AuditEvent, { type: 'credential.denied' }> =>
          event.type === 'credential.denied' && event.status === 403 && event.pod !== undefined,
      ),
    )
    .subscribe((event) => {
      const namespace = event.namespace as string;
      const name = event.pod as string;
      const owner = event.podIp === undefined ? undefined : index.ownerOf(event.podIp);
      const uid = owner?.namespace === namespace && owner.name === name ? owner.uid : undefined;
      recorder.warn({ namespace, name, uid }, ROLE_DENIED_REASON, event.reason);
    });
}
