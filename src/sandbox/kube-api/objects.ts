/** The shapes of the Kubernetes objects the fake API server keeps, as they go over the wire. */

export interface ObjectMeta {
  name: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  creationTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  [field: string]: unknown;
}

/** Metadata as stored: the server has filled in identity and version. */
export interface StoredMeta extends ObjectMeta {
  uid: string;
  resourceVersion: string;
  creationTimestamp: string;
}

export interface ObjectInput {
  metadata: ObjectMeta;
}

export interface StoredObject {
  apiVersion: string;
  kind: string;
  metadata: StoredMeta;
  [field: string]: unknown;
}

export interface Taint {
  key: string;
  value?: string;
  effect: string;
  timeAdded?: string;
}

export interface PodInput {
  metadata: ObjectMeta;
  spec?: { nodeName?: string; hostNetwork?: boolean; serviceAccountName?: string; [field: string]: unknown };
  status?: { phase?: string; podIP?: string; podIPs?: Array<{ ip: string }>; [field: string]: unknown };
}

export interface Pod extends PodInput {
  apiVersion: 'v1';
  kind: 'Pod';
  metadata: StoredMeta & { namespace: string };
}

export interface NamespaceInput {
  metadata: ObjectMeta;
  spec?: Record<string, unknown>;
  status?: Record<string, unknown>;
}

export interface Namespace extends NamespaceInput {
  apiVersion: 'v1';
  kind: 'Namespace';
  metadata: StoredMeta;
}

export interface NodeInput {
  metadata: ObjectMeta;
  spec?: { taints?: Taint[]; [field: string]: unknown };
  status?: Record<string, unknown>;
}

export interface Node extends NodeInput {
  apiVersion: 'v1';
  kind: 'Node';
  metadata: StoredMeta;
}

export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

export function withResourceVersion(object: StoredObject, rv: number): StoredObject {
  return { ...object, metadata: { ...object.metadata, resourceVersion: String(rv) } };
}

export function nowIso(): string {
  // Kubernetes timestamps have second precision.
  return new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');
}
