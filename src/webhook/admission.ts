/**
 * The admission.k8s.io/v1 AdmissionReview as the webhook reads and answers it, and the pod fields
 * the mutation relies on. Everything else in a pod passes through untouched (loose objects).
 */
import { z } from 'zod';

const EnvVar = z.object({ name: z.string().min(1), value: z.string().optional() }).loose();
const VolumeMount = z.object({ name: z.string().min(1), mountPath: z.string().min(1) }).loose();
const Container = z
  .object({
    name: z.string().min(1),
    env: z.array(EnvVar).optional(),
    volumeMounts: z.array(VolumeMount).optional(),
  })
  .loose();
const Volume = z.object({ name: z.string().min(1) }).loose();

export const Pod = z
  .object({
    metadata: z
      .object({
        name: z.string().optional(),
        generateName: z.string().optional(),
        labels: z.record(z.string(), z.string()).optional(),
        annotations: z.record(z.string(), z.string()).optional(),
      })
      .loose()
      .default({}),
    spec: z
      .object({
        containers: z.array(Container).min(1),
        initContainers: z.array(Container).optional(),
        volumes: z.array(Volume).optional(),
      })
      .loose(),
  })
  .loose();
export type Pod = z.infer<typeof Pod>;
export type PodContainer = z.infer<typeof Container>;

const GroupVersionKind = z.object({ group: z.string(), version: z.string(), kind: z.string() });

export const AdmissionReview = z.object({
  apiVersion: z.literal('admission.k8s.io/v1'),
  kind: z.literal('AdmissionReview'),
  request: z
    .object({
      uid: z.string().min(1),
      kind: GroupVersionKind,
      operation: z.string(),
      namespace: z.string().optional(),
      name: z.string().optional(),
      /** Checked as a Pod only when the request is a Pod CREATE. */
      object: z.unknown().optional(),
    })
    .loose(),
});
export type AdmissionReview = z.infer<typeof AdmissionReview>;

export interface JsonPatchOperation {
  readonly op: 'add' | 'replace';
  readonly path: string;
  readonly value: unknown;
}

/** The answer: always allowed (the webhook only adds), with a JSON patch when it changed something. */
export function admissionResponse(uid: string, patch: readonly JsonPatchOperation[], warnings: readonly string[]) {
  return {
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    response: {
      uid,
      allowed: true,
      ...(patch.length > 0
        ? { patchType: 'JSONPatch', patch: Buffer.from(JSON.stringify(patch)).toString('base64') }
        : {}),
      ...(warnings.length > 0 ? { warnings } : {}),
    },
  };
}
