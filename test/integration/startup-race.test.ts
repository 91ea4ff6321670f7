/**
 * The startup race kube2iam and kiam users hit: a pod asks for credentials before the agent has
 * seen it. Here the request waits and the pod's informer event resolves it at once.
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, it } from 'node:test';
import { filter, firstValueFrom, map, timeout } from 'rxjs';
import { ACCOUNT, AgentHarness, imdsGet } from '../fixtures/agent.js';
import { eventually } from '../../testkit/eventually.js';
import { awscliCallerIdentity, jsSdkCredentials } from '../fixtures/clients.js';

const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';

describe('startup race: a pod that asks before the agent has seen it', () => {
  let harness: AgentHarness;

  before(async () => {
    harness = await AgentHarness.create();
    await harness.startAgent({ BROKER_DEFAULT_ROLE: 'fallback-role' });
    await harness.waitUntilReady();
  });
  after(() => harness?.stop());

  const lookupIsWaiting = () =>
    eventually('a lookup waits for an unknown IP', () => harness.agent.index.waitingKeys() > 0, 10_000);

  it("gives the JS SDK its own role, not the default, resolved by the pod's event", async () => {
    const pod = await harness.addNetnsPod('late-js');
    const client = jsSdkCredentials(pod, harness.imdsEndpoint, harness.moto.endpoint);
    await lookupIsWaiting();
    await new Promise((resolve) => setTimeout(resolve, 100));
    const resolvedAt = firstValueFrom(
      harness.agent.audit.events$.pipe(
        filter((event) => event.type === 'lookup.waited' && event.podIp === pod.ip),
        map((event) => ({ event, at: performance.now() })),
        timeout(5_000),
      ),
    );
    const eventWrittenAt = performance.now();
    harness.schedulePod({ name: 'late-js', role: 'late-role', ip: pod.ip });
    const { event, at } = await resolvedAt;
    const result = await client;
    assert.ok(result.ok, result.error);
    assert.equal(result.arn, `arn:aws:sts::${ACCOUNT}:assumed-role/late-role/default@late-js`);
    assert.ok(event.type === 'lookup.waited');
    assert.equal(event.outcome, 'push');
    const pushMs = at - eventWrittenAt;
    console.log(
      `# push resolution: ${pushMs.toFixed(2)} ms from the API server writing the pod event to the waiting request resolving (waited ${event.waitedMs} ms in all)`,
    );
    assert.ok(event.type === 'lookup.waited' && event.waitedMs < event.holdMs, 'resolved before the hold ended');
  });

  it('resolves a waiting curl request within milliseconds of the pod event', async () => {
    const pod = await harness.addNetnsPod('late-curl');
    const request = imdsGet(pod, `${harness.imdsEndpoint}${CREDENTIALS}`);
    await lookupIsWaiting();
    await new Promise((resolve) => setTimeout(resolve, 100));
    const eventWrittenAt = performance.now();
    harness.schedulePod({ name: 'late-curl', role: 'late-role', ip: pod.ip });
    const waited = await harness.nextEvent((event) => event.type === 'lookup.waited' && event.podIp === pod.ip);
    const resolvedMs = performance.now() - eventWrittenAt;
    const response = await request;
    assert.equal(response.status, 200);
    assert.equal(response.body, 'late-role');
    assert.ok(waited.type === 'lookup.waited' && waited.outcome === 'push');
    console.log(`# push resolution (curl): ${resolvedMs.toFixed(2)} ms after the event was written`);
  });

  it('never gives the default role to a caller no pod owns: awscli gets a retryable 503 with the reason, inside its timeout', async () => {
    const pod = await harness.addNetnsPod('nobody');
    const result = await awscliCallerIdentity(pod, harness.imdsEndpoint, harness.moto.endpoint);
    assert.ok(!result.ok, `awscli got credentials: ${result.arn}`);
    assert.match(result.error ?? '', /Unable to locate credentials/);
    const waited = await harness.nextEvent((event) => event.type === 'lookup.waited' && event.podIp === pod.ip);
    assert.ok(waited.type === 'lookup.waited');
    assert.deepEqual([waited.outcome, waited.holdClient, waited.holdMs], ['retry', 'botocore', 750]);
    assert.ok(waited.waitedMs >= 750);
    const denied = await harness.nextEvent((event) => event.type === 'credential.denied' && event.podIp === pod.ip);
    assert.ok(denied.type === 'credential.denied');
    assert.equal(denied.status, 503);
    assert.match(
      denied.reason,
      new RegExp(`no pod on this node has IP ${pod.ip.replace(/\./g, '\\.')} after waiting \\d+ ms; retry`),
    );
    assert.ok(
      !harness.events.some((event) => event.type === 'credential.issued' && event.podIp === pod.ip),
      'no credentials of any role',
    );
  });

  it('leaves no waiting lookup behind when a client gives up before its pod appears', async () => {
    const pod = await harness.addNetnsPod('quitter');
    const result = await pod.exec(['curl', '--silent', '--max-time', '0.1', `${harness.imdsEndpoint}${CREDENTIALS}`]);
    assert.notEqual(result.code, 0, 'curl gave up');
    await eventually('the disconnect ended the lookup', () => harness.agent.index.waitingKeys() === 0);
    assert.ok(
      !harness.events.some((event) => event.type === 'lookup.waited' && event.podIp === pod.ip),
      'no decision was made for a client that left',
    );
  });
});
