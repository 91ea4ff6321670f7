/** Namespaces, for their annotations (role restrictions). */
import { CoreV1Api, type KubeConfig } from '@kubernetes/client-node';
import type { Observable } from 'rxjs';
import { z } from 'zod';
import { type InformerEvent, type WatchTimeout, informerEvents, keepFields } from './informer.js';

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
export function namespaceEvents(kubeConfig: KubeConfig, annotationKeys?: readonly string[], watchTimeout?: WatchTimeout): Observable<InformerEvent<NamespaceRecord>> {
  const api = kubeConfig.makeApiClient(CoreV1Api);
  return informerEvents({ kubeConfig, path: '/api/v1/namespaces', list: () => api.listNamespace(), parse: parseNamespace, slim: keepFields({}, annotationKeys), ...(watchTimeout ? { watchTimeout } : {}) });
}
