/** The parts of a v1 Pod the agent relies on, validated at the edge and reduced to a PodRecord. */
import type { Observable } from 'rxjs';
import { z } from 'zod';
import { type InformerEvent, type WatchTimeout, informerEvents, keepFields } from './informer.js';
import { type KubeConnection, kubeList } from './kube-connection.js';

export interface PodRecord {
  readonly uid: string;
  readonly namespace: string;
  readonly name: string;
  readonly serviceAccount: string;
  readonly nodeName: string | undefined;
  /** Every address the pod holds (dual-stack pods have two). Empty until the CNI assigns one. */
  readonly ips: readonly string[];
  readonly hostNetwork: boolean;
  readonly phase: string;
  readonly createdAtMs: number;
  readonly annotations: Readonly<Record<string, string>>;
}

const timestamp = z.iso.datetime({ offset: true }).transform((value) => Date.parse(value));

const PodSchema = z.object({
  metadata: z.object({
    uid: z.string().min(1),
    name: z.string().min(1),
    namespace: z.string().min(1),
    creationTimestamp: timestamp,
    annotations: z.record(z.string(), z.string()).nullish(),
  }),
  spec: z
    .object({
      nodeName: z.string().nullish(),
      hostNetwork: z.boolean().nullish(),
      serviceAccountName: z.string().nullish(),
    })
    .nullish(),
  status: z
    .object({
      phase: z.string().nullish(),
      podIP: z.string().nullish(),
      podIPs: z.array(z.object({ ip: z.string() })).nullish(),
    })
    .nullish(),
});

export const parsePod = (raw: unknown) =>
  PodSchema.transform((pod): PodRecord => {
    const ips = new Set<string>(pod.status?.podIPs?.map((entry) => entry.ip) ?? []);
    if (pod.status?.podIP) ips.add(pod.status.podIP);
    return {
      uid: pod.metadata.uid,
      namespace: pod.metadata.namespace,
      name: pod.metadata.name,
      serviceAccount: pod.spec?.serviceAccountName ?? 'default',
      nodeName: pod.spec?.nodeName ?? undefined,
      ips: [...ips],
      hostNetwork: pod.spec?.hostNetwork ?? false,
      phase: pod.status?.phase ?? 'Pending',
      createdAtMs: pod.metadata.creationTimestamp,
      annotations: pod.metadata.annotations ?? {},
    };
  }).safeParse(raw);

/**
 * Pods on one node when nodeName is given (the DaemonSet case), else every pod in the cluster.
 * Only the annotations named are kept in memory (all when undefined).
 */
export function podEvents(
  kube: KubeConnection,
  nodeName: string | undefined,
  annotationKeys?: readonly string[],
  watchTimeout?: WatchTimeout,
): Observable<InformerEvent<PodRecord>> {
  const fieldSelector = nodeName ? `spec.nodeName=${nodeName}` : undefined;
  return informerEvents({
    kube,
    path: '/api/v1/pods',
    fieldSelector,
    list: () => kubeList(kube, '/api/v1/pods', { fieldSelector }),
    parse: parsePod,
    slim: keepFields(
      { spec: ['nodeName', 'hostNetwork', 'serviceAccountName'], status: ['phase', 'podIP', 'podIPs'] },
      annotationKeys,
    ),
    ...(watchTimeout ? { watchTimeout } : {}),
  });
}
