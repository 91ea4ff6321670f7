/** Namespaces, for their annotations (role restrictions). */
import type { Observable } from 'rxjs';
import { z } from 'zod';
import { type InformerEvent, type WatchTimeout, informerEvents, keepFields } from './informer.js';
import { type KubeConnection, kubeList } from './kube-connection.js';

export interface NamespaceRecord {
  readonly name: string;
  readonly annotations: Readonly<Record<string, string>>;
}

const NamespaceSchema = z
  .object({
    metadata: z.object({
      name: z.string().min(1),
      annotations: z.record(z.string(), z.string()).nullish(),
    }),
  })
  .transform((ns): NamespaceRecord => ({ name: ns.metadata.name, annotations: ns.metadata.annotations ?? {} }));

export const parseNamespace = (raw: unknown) => NamespaceSchema.safeParse(raw);

/** Only the annotations named are kept in memory (all when undefined). */
export function namespaceEvents(
  kube: KubeConnection,
  annotationKeys?: readonly string[],
  watchTimeout?: WatchTimeout,
): Observable<InformerEvent<NamespaceRecord>> {
  return informerEvents({
    kube,
    path: '/api/v1/namespaces',
    list: () => kubeList(kube, '/api/v1/namespaces'),
    parse: parseNamespace,
    slim: keepFields({}, annotationKeys),
    ...(watchTimeout ? { watchTimeout } : {}),
  });
}
