/**
 * The agent against a failing API server: a cut watch stream, ERROR 410 (compaction), HTTP 500,
 * connection refused and an API server gone for seconds. While the watch is down the agent cannot
 * vouch for its index (a pod deleted meanwhile may have passed its IP on), so credential requests
 * get a retryable 503 with the reason and /readyz says 503 with the reason; once it watches again
 * both are back, and a pod deleted meanwhile gets nothing. Recovery times are printed, not
 * asserted (the machine is shared).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { filter, firstValueFrom, timeout } from 'rxjs';
import type { AppliedEvent } from '../../src/broker/pod-index.js';
import { AgentHarness, imdsGet } from '../fixtures/agent.js';
import type { NetnsPod } from '../fixtures/netns.js';

const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';

interface ReadyzSample {
  readonly status: number;
  readonly body: {
    ready: boolean;
    informers: Record<string, { synced: boolean; watching: boolean; lastError?: string }>;
  };
}

describe('API server faults: the agent answers only what it can vouch for, and tells the truth', () => {
  let harness: AgentHarness;
  let keeper: NetnsPod;
  let doomed: NetnsPod;

  before(async () => {
    harness = await AgentHarness.create();
    [keeper, doomed] = await Promise.all([harness.addNetnsPod('keeper'), harness.addNetnsPod('doomed')]);
    harness.schedulePod({ name: 'keeper', role: 'keeper-role', ip: keeper.ip });
    await harness.startAgent();
    await harness.waitUntilReady();
  });
  after(() => harness?.stop());

  const readyz = async (): Promise<ReadyzSample> => {
    const response = await fetch(`${harness.adminEndpoint}/readyz`);
    return { status: response.status, body: (await response.json()) as ReadyzSample['body'] };
  };

  /** The next pod-informer event of this type applied to the index, within a bound. */
  const nextPodsEvent = (type: AppliedEvent['event']['event']['type'], timeoutMs = 10_000) =>
    firstValueFrom(
      harness.agent.index.applied$.pipe(
        filter(({ event }) => event.resource === 'pods' && event.event.type === type),
        timeout(timeoutMs),
      ),
    );

  /** Polls /readyz until it answers 200, keeping every answer; bounded. */
  const readyzUntilReady = async (timeoutMs = 15_000): Promise<ReadyzSample[]> => {
    const samples: ReadyzSample[] = [];
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const sample = await readyz();
      samples.push(sample);
      if (sample.status === 200) return samples;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    throw new Error(`/readyz did not return to 200 within ${timeoutMs} ms: ${JSON.stringify(samples.at(-1))}`);
  };

  /** The API server's faults hit the pod and namespace watches alike: any informer not watching must say why. */
  const failingInformers = (sample: ReadyzSample) =>
    Object.values(sample.body.informers).filter((informer) => !informer.watching);
  const assertNotReadyWithReason = (sample: ReadyzSample, reason: RegExp) => {
    assert.equal(sample.status, 503);
    assert.equal(sample.body.ready, false);
    const failing = failingInformers(sample);
    assert.ok(failing.length > 0, 'an informer reports that it is not watching');
    for (const informer of failing) assert.match(informer.lastError ?? '', reason);
  };

  const roleOf = async (pod: NetnsPod) => imdsGet(pod, `${harness.imdsEndpoint}${CREDENTIALS}`);

  const scheduleDoomed = async () => {
    harness.schedulePod({ name: 'doomed', role: 'doomed-role', ip: doomed.ip });
    await harness.nextEvent(
      (event) =>
        event.type === 'pod.indexed' &&
        event.pod === 'doomed' &&
        event.podIp === doomed.ip &&
        !harness.events.some((e) => e.id > event.id && e.type === 'pod.removed' && e.pod === 'doomed'),
    );
    assert.equal((await roleOf(doomed)).body, 'doomed-role');
  };

  it('a cut watch stream is re-established, and changes made meanwhile arrive', async () => {
    const watching = nextPodsEvent('watching');
    const cutAt = performance.now();
    harness.api.dropWatches();
    harness.schedulePod({ name: 'late', role: 'late-role', ip: '10.250.0.1' });
    await watching;
    await harness.nextEvent((event) => event.type === 'pod.indexed' && event.pod === 'late');
    console.log(`watch cut: watching again after ${Math.round(performance.now() - cutAt)} ms`);
    assert.equal((await readyzUntilReady()).at(-1)?.status, 200);
    assert.equal((await roleOf(keeper)).body, 'keeper-role');
  });

  it('HTTP 500 on the re-watch: /readyz is 503 with the reason until the watch is back', async () => {
    harness.api.failRequests(3, 500);
    const disconnected = nextPodsEvent('disconnected');
    harness.api.dropWatches();
    await disconnected;
    const duringOutage = await readyz();
    const samples = await readyzUntilReady();
    const notReady = [duringOutage, ...samples].filter((sample) => sample.status !== 200);
    assert.ok(notReady.length > 0, '/readyz said 503 at least once while the watch was failing');
    for (const sample of notReady)
      assertNotReadyWithReason(sample, /Internal Server Error|500|closed|aborted|premature/i);
    assert.ok(
      notReady.some((sample) =>
        failingInformers(sample).some((informer) => /500|Internal Server Error/.test(informer.lastError ?? '')),
      ),
      'the 500 is the reason given',
    );
    assert.equal((await roleOf(keeper)).body, 'keeper-role');
  });

  it('ERROR 410 (compaction) makes the agent relist, and a pod deleted meanwhile is gone', async () => {
    await scheduleDoomed();
    await harness.api.setDown(true);
    harness.api.deletePod('default', 'doomed');
    harness.api.compact();
    const synced = nextPodsEvent('synced');
    const upAt = performance.now();
    await harness.api.setDown(false);
    await synced;
    await harness.nextEvent((event) => event.type === 'pod.removed' && event.pod === 'doomed');
    console.log(
      `410 after an outage: relisted and dropped the deleted pod ${Math.round(performance.now() - upAt)} ms after the API server returned`,
    );
    const answer = await roleOf(doomed);
    assert.equal(answer.status, 503, "the deleted pod's IP is unknown again: no credentials");
    assert.doesNotMatch(answer.body, /doomed-role/);
    assert.equal((await readyzUntilReady()).at(-1)?.status, 200);
  });

  it('API server gone for seconds (connection refused): 503 with the reason on the metadata door and /readyz, recovers, drops a pod deleted meanwhile', async () => {
    await scheduleDoomed();
    const disconnected = nextPodsEvent('disconnected');
    await harness.api.setDown(true);
    await disconnected;
    harness.api.deletePod('default', 'doomed');

    const downUntil = Date.now() + 2_500;
    const outageSamples: ReadyzSample[] = [];
    while (Date.now() < downUntil) {
      outageSamples.push(await readyz());
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    for (const sample of outageSamples)
      assertNotReadyWithReason(sample, /ECONNREFUSED|refused|closed|aborted|premature|socket/i);
    assert.ok(
      outageSamples.some((sample) =>
        failingInformers(sample).some((informer) => /ECONNREFUSED|refused/i.test(informer.lastError ?? '')),
      ),
      'connection refused is the reason given',
    );
    const keeperDuringOutage = await imdsGet(keeper, `${harness.imdsEndpoint}${CREDENTIALS}keeper-role`);
    assert.equal(keeperDuringOutage.status, 503, 'a stale index is not served, not even for a pod that still exists');
    assert.match(
      keeperDuringOutage.body,
      /cannot vouch for its pods index .*(ECONNREFUSED|refused|closed|socket).*retry/i,
    );
    const doomedDuringOutage = await roleOf(doomed);
    assert.equal(doomedDuringOutage.status, 503, 'nor the role of a pod deleted meanwhile');
    assert.doesNotMatch(doomedDuringOutage.body, /doomed-role/);

    const watching = nextPodsEvent('watching');
    const upAt = performance.now();
    await harness.api.setDown(false);
    await watching;
    const watchingAfterMs = performance.now() - upAt;
    await harness.nextEvent((event) => event.type === 'pod.removed' && event.pod === 'doomed');
    console.log(
      `API server down 2.5 s: watching again ${Math.round(watchingAfterMs)} ms after it returned; deleted pod dropped after ${Math.round(performance.now() - upAt)} ms`,
    );
    assert.equal((await roleOf(doomed)).status, 503);
    assert.equal((await readyzUntilReady()).at(-1)?.status, 200);
    const keeperAfter = await imdsGet(keeper, `${harness.imdsEndpoint}${CREDENTIALS}keeper-role`);
    assert.equal(keeperAfter.status, 200, 'served again once the agent watches again');
    assert.match(keeperAfter.body, /"AccessKeyId"/);
  });
});
