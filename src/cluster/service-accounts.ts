/** ServiceAccounts, for one annotation only: the role a pod without its own role annotation takes. */
import type { Observable } from 'rxjs';
import { z } from 'zod';
import { type InformerEvent, type WatchTimeout, informerEvents, keepFields } from './informer.js';
import { type KubeConnection, kubeList } from './kube-connection.js';

export interface ServiceAccountRecord {
  readonly namespace: string;
  readonly name: string;
  readonly annotations: Readonly<Record<string, string>>;
}

const ServiceAccountSchema = z
  .object({
    metadata: z.object({
      name: z.string().min(1),
      namespace: z.string().min(1),
      annotations: z.record(z.string(), z.string()).nullish(),
    }),
  })
  .transform((sa): ServiceAccountRecord => ({
    namespace: sa.metadata.namespace,
    name: sa.metadata.name,
    annotations: sa.metadata.annotations ?? {},
  }));

export const parseServiceAccount = (raw: unknown) => ServiceAccountSchema.safeParse(raw);

/** Every ServiceAccount in the cluster, reduced to the annotations named: a cluster has many, the agent keeps a few bytes of each. */
export function serviceAccountEvents(
  kube: KubeConnection,
  annotationKeys: readonly string[],
  watchTimeout?: WatchTimeout,
): Observable<InformerEvent<ServiceAccountRecord>> {
  return informerEvents({
    kube,
    path: '/api/v1/serviceaccounts',
    list: () => kubeList(kube, '/api/v1/serviceaccounts'),
    parse: parseServiceAccount,
    slim: keepFields({}, annotationKeys),
    ...(watchTimeout ? { watchTimeout } : {}),
  });
}
