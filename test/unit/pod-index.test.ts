import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { PodIndex } from '../../src/broker/pod-index.js';
import { podRecord, podsEvent, remove, upsert } from '../support/pods.js';

describe('pod index', () => {
  it('indexes a live pod by each of its IPs', () => {
    const index = new PodIndex('node-a');
    const pod = podRecord({ name: 'web', ips: ['10.0.0.5', 'fd00::5'] });
    const change = index.apply(upsert(pod));
    assert.equal(index.ownerOf('10.0.0.5')?.uid, pod.uid);
    assert.equal(index.ownerOf('fd00::5')?.uid, pod.uid);
    assert.deepEqual(change.keys.toSorted(), ['ip:10.0.0.5', 'ip:fd00::5']);
    assert.equal(change.ownerChanges.length, 2);
  });

  it('never matches hostNetwork pods, pods without an IP, or Succeeded and Failed pods', () => {
    const index = new PodIndex('node-a');
    index.apply(upsert(podRecord({ name: 'host', ips: ['10.0.0.1'], hostNetwork: true })));
    index.apply(upsert(podRecord({ name: 'done', ips: ['10.0.0.2'], phase: 'Succeeded' })));
    index.apply(upsert(podRecord({ name: 'failed', ips: ['10.0.0.3'], phase: 'Failed' })));
    index.apply(upsert(podRecord({ name: 'new' })));
    assert.equal(index.ownerOf('10.0.0.1'), undefined);
    assert.equal(index.ownerOf('10.0.0.2'), undefined);
    assert.equal(index.ownerOf('10.0.0.3'), undefined);
    assert.equal(index.podsAwaitingIp(), 1, 'the pod without an IP on this node awaits one');
  });

  it('releases the IP when the pod finishes (Running → Succeeded)', () => {
    const index = new PodIndex('node-a');
    const pod = podRecord({ name: 'job', ips: ['10.0.0.9'] });
    index.apply(upsert(pod));
    const change = index.apply(upsert({ ...pod, phase: 'Succeeded' }));
    assert.equal(index.ownerOf('10.0.0.9'), undefined);
    assert.deepEqual(
      change.ownerChanges.map((c) => [c.ip, c.before?.name, c.after?.name]),
      [['10.0.0.9', 'job', undefined]],
    );
  });

  it("gives a reused IP to the newer pod, and the old pod's late delete does not remove it", () => {
    const index = new PodIndex('node-a');
    const old = podRecord({ name: 'old', uid: 'u-old', ips: ['10.0.0.7'], createdAtMs: 1_000 });
    const reuser = podRecord({ name: 'new', uid: 'u-new', ips: ['10.0.0.7'], createdAtMs: 2_000, phase: 'Pending' });
    index.apply(upsert(old));
    index.apply(upsert(reuser));
    assert.equal(index.ownerOf('10.0.0.7')?.uid, 'u-new');
    index.apply(remove(old));
    assert.equal(index.ownerOf('10.0.0.7')?.uid, 'u-new');
  });

  it("gives a reused IP to the new pod when the old pod's delete came first", () => {
    const index = new PodIndex('node-a');
    const old = podRecord({ name: 'old', uid: 'u-old', ips: ['10.0.0.7'], createdAtMs: 1_000 });
    index.apply(upsert(old));
    index.apply(remove(old));
    assert.equal(index.ownerOf('10.0.0.7'), undefined);
    index.apply(upsert(podRecord({ name: 'new', uid: 'u-new', ips: ['10.0.0.7'], createdAtMs: 2_000 })));
    assert.equal(index.ownerOf('10.0.0.7')?.uid, 'u-new');
  });

  it('breaks a tie between pods created in the same second by the later claim', () => {
    const index = new PodIndex('node-a');
    index.apply(upsert(podRecord({ name: 'a', uid: 'u-a', ips: ['10.0.0.8'], createdAtMs: 5_000 })));
    index.apply(upsert(podRecord({ name: 'b', uid: 'u-b', ips: ['10.0.0.8'], createdAtMs: 5_000 })));
    assert.equal(index.ownerOf('10.0.0.8')?.uid, 'u-b');
    // An annotation change on the first pod does not make it the newer claim.
    index.apply(
      upsert(podRecord({ name: 'a', uid: 'u-a', ips: ['10.0.0.8'], createdAtMs: 5_000, annotations: { x: 'y' } })),
    );
    assert.equal(index.ownerOf('10.0.0.8')?.uid, 'u-b');
  });

  it('drops a pod replaced under the same name with a new uid (as a relist reports it)', () => {
    const index = new PodIndex('node-a');
    index.apply(upsert(podRecord({ name: 'web-0', uid: 'u-1', ips: ['10.0.0.4'] })));
    index.apply(upsert(podRecord({ name: 'web-0', uid: 'u-2', ips: ['10.0.0.6'] })));
    assert.equal(index.ownerOf('10.0.0.4'), undefined);
    assert.equal(index.ownerOf('10.0.0.6')?.uid, 'u-2');
    assert.equal(index.podCount(), 1);
  });

  it('tracks informer health: synced once listed, watching until disconnected', () => {
    const index = new PodIndex('node-a');
    assert.deepEqual(index.health('pods'), { synced: false, watching: false });
    index.apply(podsEvent({ type: 'synced' }));
    index.apply(podsEvent({ type: 'watching' }));
    assert.deepEqual(index.health('pods'), { synced: true, watching: true });
    index.apply(podsEvent({ type: 'disconnected', error: 'socket hang up', retryInMs: 100 }));
    assert.deepEqual(index.health('pods'), { synced: true, watching: false, lastError: 'socket hang up' });
  });

  it('counts only pods scheduled to its node as awaiting an IP', () => {
    const index = new PodIndex('node-a');
    index.apply(upsert(podRecord({ name: 'here', nodeName: 'node-a', phase: 'Pending' })));
    index.apply(upsert(podRecord({ name: 'there', nodeName: 'node-b', phase: 'Pending' })));
    index.apply(upsert(podRecord({ name: 'host', nodeName: 'node-a', hostNetwork: true })));
    assert.equal(index.podsAwaitingIp(), 1);
  });
});
