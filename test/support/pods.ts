/** Builders for the records the core works on, shared by unit and model tests. */
import type { InformerEvent } from '../../src/cluster/informer.js';
import type { PodRecord } from '../../src/cluster/pods.js';
import type { IndexEvent } from '../../src/broker/pod-index.js';

export function podRecord(overrides: Partial<PodRecord> & { name: string }): PodRecord {
  return {
    uid: `uid-${overrides.name}`,
    namespace: 'default',
    serviceAccount: 'default',
    nodeName: 'node-a',
    ips: [],
    hostNetwork: false,
    phase: 'Running',
    createdAtMs: 1_000,
    annotations: {},
    ...overrides,
  };
}

export const upsert = (pod: PodRecord): IndexEvent => ({ resource: 'pods', event: { type: 'upsert', object: pod } });
export const remove = (pod: PodRecord): IndexEvent => ({ resource: 'pods', event: { type: 'delete', object: pod } });
export const podsEvent = (event: InformerEvent<PodRecord>): IndexEvent => ({ resource: 'pods', event });
