/**
 * The default role is for known pods only. A caller whose pod the agent does not know (here: a
 * pod whose IP the API server has not reported yet) gets a retryable 503 with the reason, never
 * the default role, and its own role once its IP is known. The removed fallback option is still
 * accepted for one release, with a warning and no effect.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentHarness, imdsGet } from '../fixtures/agent.js';
import type { NetnsPod } from '../fixtures/netns.js';

const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';

describe('a caller whose pod the agent does not know, with a default role configured', () => {
  let harness: AgentHarness;
  let caller: NetnsPod;

  before(async () => {
    harness = await AgentHarness.create();
    caller = await harness.addNetnsPod('caller');
    // The caller's pod object exists but the CNI has not reported its IP yet.
    harness.schedulePod({ name: 'caller', role: 'caller-role', phase: 'Pending' });
  });
  after(() => harness?.stop());

  it('answers a retryable 503 that says why, not the default role', async () => {
    await harness.startAgent({ BROKER_DEFAULT_ROLE: 'fallback-role' });
    await harness.waitUntilReady();
    const response = await imdsGet(caller, `${harness.imdsEndpoint}${CREDENTIALS}`);
    assert.equal(response.status, 503);
    assert.match(
      response.body,
      new RegExp(
        `^no pod on this node has IP ${caller.ip.replace(/\./g, '\\.')} after waiting \\d+ ms; 1 pod\\(s\\) on this node still wait for an IP, the caller may be one of them; retry$`,
      ),
    );
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

  it('still accepts BROKER_DEFER_DEFAULT_ROLE_FOR_PENDING_PODS=false, warns that it has no effect, and still never gives the default role', async () => {
    await harness.agent.stop();
    harness.schedulePod({ name: 'caller', role: 'caller-role', phase: 'Pending' });
    await harness.startAgent({
      BROKER_DEFAULT_ROLE: 'fallback-role',
      BROKER_DEFER_DEFAULT_ROLE_FOR_PENDING_PODS: 'false',
      BROKER_GRACE_WINDOW_MS: '100',
    });
    await harness.waitUntilReady();
    const warning = harness.logs
      .map((line) => JSON.parse(line) as { level: number; msg: string })
      .find((entry) => entry.msg.startsWith('BROKER_DEFER_DEFAULT_ROLE_FOR_PENDING_PODS'));
    assert.ok(warning, 'a deprecation warning is logged at start');
    assert.equal(warning.level, 40, 'at warn level');
    assert.match(warning.msg, /deprecated and has no effect/);
    const response = await imdsGet(caller, `${harness.imdsEndpoint}${CREDENTIALS}`);
    assert.equal(response.status, 503);
    assert.doesNotMatch(response.body, /fallback-role/);
  });
});
