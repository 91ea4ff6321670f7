/**
 * The candidate-aware fallback end to end: with a default role configured, an unknown caller
 * gets it only when no pod on the node is still waiting for an IP. Otherwise the caller is
 * probably that pod, one informer event away from its own role, and gets a retryable 503.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentHarness, imdsGet } from '../fixtures/agent.js';
import type { NetnsPod } from '../fixtures/netns.js';

const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';

describe('default role while pods on the node await an IP', () => {
  let harness: AgentHarness;
  let caller: NetnsPod;

  before(async () => {
    harness = await AgentHarness.create();
    caller = await harness.addNetnsPod('caller');
    // The caller's pod object exists but the CNI has not reported its IP yet.
    harness.schedulePod({ name: 'caller', role: 'caller-role', phase: 'Pending' });
  });
  after(() => harness?.stop());

  it('answers a retryable 503, not the default role, to an unknown caller (BROKER_DEFER_DEFAULT_ROLE_FOR_PENDING_PODS default true)', async () => {
    await harness.startAgent({ BROKER_DEFAULT_ROLE: 'fallback-role' });
    await harness.waitUntilReady();
    const response = await imdsGet(caller, `${harness.imdsEndpoint}${CREDENTIALS}`);
    assert.equal(response.status, 503);
    assert.match(response.body, /1 pod\(s\) on this node are still waiting for an IP/);
    const denied = await harness.nextEvent((event) => event.type === 'credential.denied' && event.podIp === caller.ip);
    assert.equal(denied.type === 'credential.denied' && denied.status, 503);
  });

  it('gives that caller its own role once its IP is reported, never the default one', async () => {
    harness.schedulePod({ name: 'caller', role: 'caller-role', phase: 'Running', ip: caller.ip });
    await harness.nextEvent((event) => event.type === 'pod.indexed' && event.pod === 'caller');
    const response = await imdsGet(caller, `${harness.imdsEndpoint}${CREDENTIALS}`);
    assert.equal(response.status, 200);
    assert.equal(response.body, 'caller-role');
  });

  it('gives the default role to an unknown caller when the option is false, even with a pod awaiting its IP', async () => {
    await harness.agent.stop();
    harness.schedulePod({ name: 'caller', role: 'caller-role', phase: 'Pending' });
    await harness.startAgent({ BROKER_DEFAULT_ROLE: 'fallback-role', BROKER_DEFER_DEFAULT_ROLE_FOR_PENDING_PODS: 'false' });
    await harness.waitUntilReady();
    assert.equal(harness.agent.index.view.podsAwaitingIp(), 1);
    const response = await imdsGet(caller, `${harness.imdsEndpoint}${CREDENTIALS}`);
    assert.equal(response.status, 200);
    assert.equal(response.body, 'fallback-role');
  });
});
