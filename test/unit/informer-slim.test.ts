import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { KubernetesObject } from '@kubernetes/client-node';
import { keepFields } from '../../src/cluster/informer.js';
import { parsePod } from '../../src/cluster/pods.js';

const fullPod = {
  kind: 'Pod',
  metadata: {
    name: 'web',
    namespace: 'shop',
    uid: 'u-1',
    resourceVersion: '42',
    creationTimestamp: '2026-11-29T19:00:00Z',
    managedFields: [{ manager: 'kubectl' }],
    annotations: {
      'iam.amazonaws.com/role': 'reader',
      'kubectl.kubernetes.io/last-applied-configuration': '{"huge":true}',
    },
  },
  spec: { nodeName: 'node-a', serviceAccountName: 'app', containers: [{ name: 'web', image: 'web:1' }] },
  status: { phase: 'Running', podIP: '10.0.0.5', podIPs: [{ ip: '10.0.0.5' }], conditions: [{ type: 'Ready' }] },
};

describe('informer slimming', () => {
  it('keeps what the agent reads and the annotations it names, nothing else', () => {
    const slim = keepFields(
      { spec: ['nodeName', 'hostNetwork', 'serviceAccountName'], status: ['phase', 'podIP', 'podIPs'] },
      ['iam.amazonaws.com/role'],
    );
    const slimmed = slim(fullPod as unknown as KubernetesObject);
    assert.deepEqual(slimmed, {
      kind: 'Pod',
      metadata: {
        name: 'web',
        namespace: 'shop',
        uid: 'u-1',
        resourceVersion: '42',
        creationTimestamp: '2026-11-29T19:00:00Z',
        annotations: { 'iam.amazonaws.com/role': 'reader' },
      },
      spec: { nodeName: 'node-a', serviceAccountName: 'app' },
      status: { phase: 'Running', podIP: '10.0.0.5', podIPs: [{ ip: '10.0.0.5' }] },
    });
    const full = parsePod(fullPod);
    const slimRecord = parsePod(slimmed);
    assert.ok(full.success && slimRecord.success);
    assert.deepEqual(
      slimRecord.data,
      { ...full.data, annotations: { 'iam.amazonaws.com/role': 'reader' } },
      'the same record, less the unread annotations',
    );
  });
});
