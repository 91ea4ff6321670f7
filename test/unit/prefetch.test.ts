import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { LivePodIndex } from '../../src/broker/pod-index.js';
import type { RolePolicy } from '../../src/broker/policy.js';
import type { RoleIdentity } from '../../src/model/role-identity.js';
import { prefetchCredentials } from '../../src/credentials/prefetch.js';
import { podRecord, remove, upsert } from '../support/pods.js';

const policy: RolePolicy = {
  roleAnnotation: 'iam.amazonaws.com/role',
  externalIdAnnotation: 'iam.amazonaws.com/external-id',
  defaultRole: undefined,
};
const BASE = 'arn:aws:iam::123456789012:role/';

function harness() {
  const index = new LivePodIndex('node-a');
  const tracked = new Map<string, number>();
  const label = (identity: RoleIdentity) => `${identity.roleArn.slice(BASE.length)}/${identity.sessionName}`;
  const cache = {
    track: (identity: RoleIdentity) => tracked.set(label(identity), (tracked.get(label(identity)) ?? 0) + 1),
    untrack: (identity: RoleIdentity) => {
      const left = (tracked.get(label(identity)) ?? 0) - 1;
      if (left > 0) tracked.set(label(identity), left);
      else tracked.delete(label(identity));
    },
  };
  const subscription = prefetchCredentials({
    applied$: index.applied$,
    view: index.view,
    policy,
    baseRoleArn: () => BASE,
    cache,
  });
  return { index, tracked, subscription };
}

describe('prefetch', () => {
  it('tracks the identity of a pod with a role as soon as it has an IP, and releases it when the pod goes', () => {
    const { index, tracked, subscription } = harness();
    const pending = podRecord({ name: 'web', annotations: { 'iam.amazonaws.com/role': 'reader' } });
    index.apply(upsert(pending));
    assert.equal(tracked.size, 0, 'no IP yet: nobody can ask');
    const running = { ...pending, ips: ['10.0.0.5', 'fd00::5'] };
    index.apply(upsert(running));
    assert.deepEqual([...tracked], [['reader/default@web', 2]]);
    index.apply(remove(running));
    assert.equal(tracked.size, 0);
    subscription.unsubscribe();
  });

  it('swaps identities when the role annotation changes, and ignores pods without a role', () => {
    const { index, tracked, subscription } = harness();
    const pod = podRecord({ name: 'web', ips: ['10.0.0.5'], annotations: { 'iam.amazonaws.com/role': 'reader' } });
    index.apply(upsert(pod));
    index.apply(upsert({ ...pod, annotations: { 'iam.amazonaws.com/role': 'writer' } }));
    assert.deepEqual([...tracked], [['writer/default@web', 1]]);
    index.apply(upsert({ ...pod, annotations: {} }));
    assert.equal(tracked.size, 0);
    index.apply(upsert(podRecord({ name: 'plain', ips: ['10.0.0.6'] })));
    assert.equal(tracked.size, 0);
    subscription.unsubscribe();
  });

  it("moves a reused IP to the new pod's identity", () => {
    const { index, tracked, subscription } = harness();
    const old = podRecord({ name: 'old', ips: ['10.0.0.5'], annotations: { 'iam.amazonaws.com/role': 'reader' } });
    index.apply(upsert(old));
    index.apply(
      upsert(
        podRecord({
          name: 'new',
          uid: 'uid-new',
          createdAtMs: 2_000,
          ips: ['10.0.0.5'],
          annotations: { 'iam.amazonaws.com/role': 'writer' },
        }),
      ),
    );
    assert.deepEqual([...tracked], [['writer/default@new', 1]]);
    subscription.unsubscribe();
  });
});
