/**
 * Credential supply against real parts: the agent's STS calls go through a counting, throttling
 * proxy in front of moto; pods are network namespaces running real SDK clients.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { AuditEvent } from '../../src/audit/events.js';
import { AgentHarness, imdsGet } from '../fixtures/agent.js';
import { boto3Credentials, jsSdkCredentials } from '../fixtures/clients.js';
import type { NetnsPod } from '../fixtures/netns.js';
import { StsProxy, never } from '../../testkit/sts-proxy.js';

const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';
const STS_QPS = 5;
const STS_BURST = 2;

describe('credential supply: prefetch, STS discipline, static stability, metrics', () => {
  let harness: AgentHarness;
  let proxy: StsProxy;
  const pods: Record<string, NetnsPod> = {};

  const stsCallsFor = (session: string) => proxy.assumeRoleCalls().filter((call) => call.sessionName === session);
  const stsSuccess = (session: string) => (event: AuditEvent) =>
    event.type === 'sts.call' && event.sessionName === session && event.outcome === 'success';

  before(async () => {
    harness = await AgentHarness.create();
    proxy = await StsProxy.start('127.0.0.1', harness.moto.endpoint);
    // The agent's SDK reads this when it starts: its STS is the proxy, the clients' STS stays moto.
    process.env.AWS_ENDPOINT_URL_STS = proxy.endpoint;
    for (const name of ['early', 'throttled', 'stale', 'slow']) pods[name] = await harness.addNetnsPod(name);
    harness.schedulePod({ name: 'early', role: 'app-early', ip: pods.early?.ip });
    await harness.startAgent({ BROKER_STS_QPS: String(STS_QPS), BROKER_STS_BURST: String(STS_BURST) });
    await harness.waitUntilReady();
  });
  after(async () => {
    await harness?.stop();
    await proxy?.stop();
  });

  it("fetches a pod's credentials when it appears, so its first request makes no STS call", async () => {
    await harness.nextEvent(stsSuccess('default@early'));
    assert.equal(stsCallsFor('default@early').length, 1);
    const response = await imdsGet(pods.early as NetnsPod, `${harness.imdsEndpoint}${CREDENTIALS}app-early`);
    assert.equal(response.status, 200);
    const js = await jsSdkCredentials(pods.early as NetnsPod, harness.imdsEndpoint, harness.moto.endpoint);
    assert.ok(js.ok, js.error);
    assert.equal(stsCallsFor('default@early').length, 1, 'no STS call after the prefetch');
    const issued = harness.events.filter((event) => event.type === 'credential.issued' && event.pod === 'early');
    assert.ok(
      issued.length >= 2 && issued.every((event) => event.type === 'credential.issued' && event.cache === 'hit'),
    );
  });

  it('retries through STS throttling, and real SDK clients get their credentials', async () => {
    // Throttle this pod's first two calls (the SDK clients start after them, within their own 1 s waits).
    proxy.throttle = () => stsCallsFor('default@throttled').length < 2;
    harness.schedulePod({ name: 'throttled', role: 'app-throttled', ip: pods.throttled?.ip });
    const [boto3, js] = await Promise.all([
      boto3Credentials(pods.throttled as NetnsPod, harness.imdsEndpoint, harness.moto.endpoint),
      jsSdkCredentials(pods.throttled as NetnsPod, harness.imdsEndpoint, harness.moto.endpoint),
    ]);
    proxy.throttle = never;
    assert.ok(boto3.ok, boto3.error);
    assert.ok(js.ok, js.error);
    assert.match(js.arn ?? '', /assumed-role\/app-throttled\/default@throttled$/);
    const calls = stsCallsFor('default@throttled');
    assert.deepEqual(
      calls.map((call) => call.throttled),
      [true, true, false],
      'two throttled calls, then one that passed',
    );
    assert.ok(harness.events.some((event) => event.type === 'sts.call' && event.outcome === 'throttled'));
  });

  it('keeps serving cached credentials until their real expiry while STS fails, and says so', async () => {
    proxy.expiresInMs = 20 * 60_000; // below the 30 minutes normally required: every request wants a refresh
    harness.schedulePod({ name: 'stale', role: 'app-stale', ip: pods.stale?.ip });
    await harness.nextEvent(stsSuccess('default@stale'));
    proxy.expiresInMs = undefined;
    await harness.moto.failAuth(true);
    try {
      const response = await imdsGet(pods.stale as NetnsPod, `${harness.imdsEndpoint}${CREDENTIALS}app-stale`);
      assert.equal(response.status, 200);
      const expiresInMs = Date.parse(JSON.parse(response.body).Expiration) - Date.now();
      assert.ok(expiresInMs > 0 && expiresInMs <= 20 * 60_000, 'the cached (short-lived) credentials');
      const issued = await harness.nextEvent((event) => event.type === 'credential.issued' && event.pod === 'stale');
      assert.equal(issued.type === 'credential.issued' && issued.cache, 'stale');
      assert.ok(
        harness.events.some(
          (event) => event.type === 'sts.call' && event.sessionName === 'default@stale' && event.outcome === 'error',
        ),
        'the failed refresh is an event',
      );
      assert.ok(
        harness.logs.some((line) => line.includes('"cache":"stale"') && line.includes('"level":40')),
        'logged as a warning',
      );
    } finally {
      await harness.moto.failAuth(false);
    }
  });

  it('answers a slow STS with a retryable 503 by the deadline, and the next request finds the credentials', async () => {
    proxy.delayMs = 1_500;
    harness.schedulePod({ name: 'slow', role: 'app-slow', ip: pods.slow?.ip });
    await harness.nextEvent((event) => event.type === 'pod.indexed' && event.pod === 'slow');
    const started = Date.now();
    const first = await imdsGet(pods.slow as NetnsPod, `${harness.imdsEndpoint}${CREDENTIALS}app-slow`);
    const heldMs = Date.now() - started;
    proxy.delayMs = 0;
    assert.equal(first.status, 503);
    assert.match(first.body, /still trying in the background/);
    console.log(`slow STS: 503 after ${heldMs} ms (deadline 450 ms)`);
    assert.ok(heldMs < 1_500, 'answered before STS did');
    await harness.nextEvent(stsSuccess('default@slow'));
    const second = await imdsGet(pods.slow as NetnsPod, `${harness.imdsEndpoint}${CREDENTIALS}app-slow`);
    assert.equal(second.status, 200);
    assert.equal(stsCallsFor('default@slow').length, 1, 'one STS call for both requests');
  });

  it('holds the AssumeRole rate limit, counted at the proxy', async () => {
    const before = proxy.assumeRoleCalls().length;
    const count = 12;
    for (let i = 0; i < count; i++)
      harness.schedulePod({ name: `burst-${i}`, role: 'app-burst', ip: `10.201.0.${i + 10}` });
    for (let i = 0; i < count; i++) await harness.nextEvent(stsSuccess(`default@burst-${i}`), 15_000);
    const calls = proxy.assumeRoleCalls().slice(before);
    assert.equal(calls.length, count);
    const first = calls[0]?.atMs ?? 0;
    calls.forEach((call, i) => {
      // Call i+1 needs i+1 tokens: the burst plus what the rate refilled since the first (1 of slack for clock rounding).
      const allowed = STS_BURST + (STS_QPS * (call.atMs - first)) / 1000 + 1;
      assert.ok(
        i + 1 <= allowed,
        `call ${i + 1} came ${call.atMs - first} ms after the first: over ${STS_QPS}/s with burst ${STS_BURST}`,
      );
    });
    console.log(`rate limit: ${count} calls over ${(calls.at(-1)?.atMs ?? 0) - first} ms`);
  });

  it('exposes the metric families on /metrics with values from the requests above', async () => {
    const response = await fetch(harness.metricsEndpoint);
    assert.equal(response.status, 200);
    const text = await response.text();
    const value = (series: string): number => {
      const line = text.split('\n').find((l) => l.startsWith(`${series} `));
      assert.ok(line, `missing ${series}`);
      return Number(line.split(' ').at(-1));
    };
    assert.ok(value('kube_iam_broker_http_request_duration_seconds_count{route="credentials",status="200"}') >= 4);
    assert.ok(value('kube_iam_broker_http_request_duration_seconds_count{route="credentials",status="503"}') >= 1);
    // The slow-STS 503 is told apart from an unknown caller's by its bounded reason.
    assert.ok(value('kube_iam_broker_credentials_denied_total{status="503",reason="sts-failed"}') >= 1);
    assert.ok(!text.includes('reason="unknown-pod"'), 'no unknown caller in this suite');
    assert.match(text, /^process_resident_memory_bytes \d+/m, "Node's process metrics under their standard names");
    assert.match(text, /^nodejs_heap_size_used_bytes \d+/m);
    assert.match(text, /^kube_iam_broker_build_info\{version="\d+\.\d+\.\d+",nodejs_version="v[\d.]+"\} 1$/m);
    assert.ok(value('kube_iam_broker_credentials_issued_total{cache="hit",source="annotation"}') >= 2);
    assert.ok(value('kube_iam_broker_credentials_issued_total{cache="stale",source="annotation"}') >= 1);
    // Prefetches no client waited for: 'early' and the burst pods. Others (throttled, slow) count as
    // background or client depending on whether a client's request joined the fetch first.
    assert.ok(value('kube_iam_broker_sts_calls_total{trigger="background",outcome="success"}') >= 13);
    assert.ok(value('kube_iam_broker_sts_calls_total{trigger="background",outcome="throttled"}') >= 2);
    assert.ok(value('kube_iam_broker_sts_call_duration_seconds_count{outcome="success"}') >= 15);
    assert.ok(value('kube_iam_broker_lookup_wait_seconds_count') >= 4);
    assert.equal(value('kube_iam_broker_informer_synced{resource="pods"}'), 1);
    assert.ok(value('kube_iam_broker_informer_relists_total{resource="pods"}') >= 1);
    assert.equal(value('kube_iam_broker_informer_restarts_total{resource="pods"}'), 0);
    assert.ok(value('kube_iam_broker_credential_cache_size') >= 15);
    assert.equal(value('kube_iam_broker_pending_lookups'), 0);
    assert.ok(value('kube_iam_broker_pods_indexed') >= 16);
  });

  it('forgets the identity of a deleted pod', async () => {
    const sizeBefore = harness.events.length;
    harness.api.deletePod('default', 'burst-0');
    await harness.nextEvent((event) => event.type === 'pod.removed' && event.pod === 'burst-0');
    const text = await (await fetch(harness.metricsEndpoint)).text();
    const size = Number(/^kube_iam_broker_credential_cache_size (\d+)/m.exec(text)?.[1]);
    assert.ok(harness.events.length > sizeBefore);
    assert.equal(size, 15, 'one identity fewer');
  });
});
