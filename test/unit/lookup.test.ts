import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { VirtualTimeScheduler } from 'rxjs';
import { type LookupOutcome, lookup } from '../../src/broker/lookup.js';
import { LivePodIndex } from '../../src/broker/pod-index.js';
import { podRecord, upsert } from '../support/pods.js';

function setup(holdMs = 300, needsNamespace = false) {
  const scheduler = new VirtualTimeScheduler();
  const index = new LivePodIndex('node-a');
  const outcomes: LookupOutcome[] = [];
  const start = (ip: string) =>
    lookup(index, ip, { holdMs, needsNamespace, scheduler }).subscribe((outcome) => outcomes.push(outcome));
  const at = (ms: number, work: () => void) => scheduler.schedule(work, ms);
  return { scheduler, index, outcomes, start, at };
}

describe('lookup', () => {
  it('answers a known IP at once, from the index', () => {
    const { index, outcomes, start } = setup();
    index.apply(upsert(podRecord({ name: 'web', ips: ['10.0.0.5'] })));
    start('10.0.0.5');
    assert.equal(outcomes.length, 1, 'resolved synchronously');
    assert.deepEqual([outcomes[0]?.kind, outcomes[0]?.kind === 'found' && outcomes[0].resolvedBy], ['found', 'index']);
  });

  it('resolves a waiting lookup inside the event that brings its pod', () => {
    const { scheduler, index, outcomes, start, at } = setup();
    start('10.0.0.5');
    at(100, () => {
      index.apply(upsert(podRecord({ name: 'other', ips: ['10.0.0.6'] })));
      assert.equal(outcomes.length, 0, 'another pod does not resolve it');
      index.apply(upsert(podRecord({ name: 'web', ips: ['10.0.0.5'] })));
      assert.equal(outcomes.length, 1, 'resolved within the event handler');
    });
    scheduler.flush();
    const outcome = outcomes[0];
    assert.ok(outcome?.kind === 'found');
    assert.equal(outcome.pod.name, 'web');
    assert.equal(outcome.resolvedBy, 'push');
    assert.equal(outcome.waitedMs, 100);
    assert.equal(index.waitingKeys(), 0, 'no waiter outlives its lookup');
  });

  it("ends with the request's hold, reporting pods still waiting for an IP", () => {
    const { scheduler, index, outcomes, start } = setup(300);
    index.apply(upsert(podRecord({ name: 'starting', phase: 'Pending' })));
    start('10.0.0.5');
    scheduler.flush();
    assert.deepEqual(outcomes, [{ kind: 'timeout', waitedMs: 300, podsAwaitingIp: 1, missing: 'pod' }]);
    assert.equal(index.waitingKeys(), 0);
  });

  it('removes the waiter when the request goes away', () => {
    const { index, outcomes, start } = setup();
    const subscription = start('10.0.0.5');
    assert.equal(index.waitingKeys(), 1);
    subscription.unsubscribe();
    assert.equal(index.waitingKeys(), 0);
    index.apply(upsert(podRecord({ name: 'web', ips: ['10.0.0.5'] })));
    assert.equal(outcomes.length, 0);
  });

  it('waits for the namespace too when restrictions need it', () => {
    const { scheduler, index, outcomes, start, at } = setup(300, true);
    index.apply(upsert(podRecord({ name: 'web', namespace: 'team-a', ips: ['10.0.0.5'] })));
    start('10.0.0.5');
    at(50, () =>
      index.apply({ resource: 'namespaces', event: { type: 'upsert', object: { name: 'team-a', annotations: {} } } }),
    );
    scheduler.flush();
    assert.ok(outcomes[0]?.kind === 'found');
    assert.equal(outcomes[0].namespace?.name, 'team-a');
    assert.equal(outcomes[0].waitedMs, 50);
  });

  it('reports a missing namespace when the window ends with the pod known', () => {
    const { scheduler, index, outcomes, start } = setup(300, true);
    index.apply(upsert(podRecord({ name: 'web', namespace: 'team-a', ips: ['10.0.0.5'] })));
    start('10.0.0.5');
    scheduler.flush();
    assert.equal(outcomes[0]?.kind === 'timeout' && outcomes[0].missing, 'namespace');
  });
});
