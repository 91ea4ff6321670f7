/**
 * Never a wrong role, with real SDK clients: a default role is configured, and each client's pod
 * becomes known to the agent 150 ms, 600 ms or 1.2 s after the client's first request (informer
 * lag). The default role never; the pod's own role whenever the pod is known before the client's
 * last attempt ends; otherwise a clear error, from a 503 the agent sent inside the client's timeout.
 *
 * Which cells that is, from each SDK's timeouts (../shared/reference/imds-protocol.md) and its hold
 * (src/imds/client-holds.ts):
 *   awscli, boto3, JS SDK v3: one attempt of 1 s, held 750 ms: own role at 150 and 600 ms; at 1.2 s the
 *     attempt has ended (503 at ~750 ms): an error.
 *   Go SDK v1: three attempts of 1 s, held 750 ms each: own role in every cell (the second attempt is
 *     still held at 1.2 s).
 *   Go SDK v2: three attempts of 500 ms, held 300 ms each, with a jittered backoff of up to 1 s between
 *     them: own role at 150 and 600 ms; at 1.2 s own role when the backoffs put its third attempt
 *     past 1.2 s, an error otherwise (checked against the agent's own record of the attempts).
 * One trial per cell here; `npm run bench` runs more and writes the table to BENCHMARKS.md.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentHarness } from '../fixtures/agent.js';
import { goClientBinary } from '../fixtures/go-clients.js';
import { DEFAULT_ROLE, LATE_MS, LATE_POD_CLIENTS, type LatePodTrial, latePodTrial } from '../fixtures/late-pods.js';

/** Cells whose outcome the timeouts decide outright; the others are checked by the rule alone. */
const EXPECTED: Record<string, Record<number, LatePodTrial['outcome']>> = {
  awscli: { 150: 'own', 600: 'own', 1_200: 'error' },
  boto3: { 150: 'own', 600: 'own', 1_200: 'error' },
  'js-sdk-v3': { 150: 'own', 600: 'own', 1_200: 'error' },
  'go-sdk-v1': { 150: 'own', 600: 'own', 1_200: 'own' },
  'go-sdk-v2': { 150: 'own', 600: 'own' },
};

/** The client's own words when the agent's 503 ended its last attempt. */
const CLEAR_ERROR: Record<string, RegExp> = {
  awscli: /Unable to locate credentials/,
  boto3: /the instance-metadata provider found no credentials/,
  'js-sdk-v3': /Error response received from instance metadata service/,
  'go-sdk-v1': /503|EC2RoleRequestError|no EC2 instance role found/i,
  'go-sdk-v2': /503|no EC2 IMDS role found/i,
};

describe('pods known late, real SDK clients, a default role configured', () => {
  let harness: AgentHarness;
  const trials: LatePodTrial[] = [];

  before(async () => {
    await Promise.all([goClientBinary('v1'), goClientBinary('v2')]);
    harness = await AgentHarness.create();
    await harness.startAgent({ BROKER_DEFAULT_ROLE: DEFAULT_ROLE, BROKER_LOG_LEVEL: 'warn' });
    await harness.waitUntilReady();
  });
  after(async () => {
    for (const trial of trials) {
      console.log(
        `# ${trial.client.padEnd(10)} ${String(trial.lateMs).padStart(5)} ms late: ${trial.outcome.padEnd(5)} known at ${trial.knownAtMs ?? '-'} ms; answers ${trial.answers.map((a) => `${a.status}@${a.atMs}`).join(' ')}${trial.result.ok ? '' : `; error: ${trial.result.error}`}`,
      );
    }
    await harness?.stop();
  });

  for (const lateMs of LATE_MS) {
    it(`pod known ${lateMs} ms after the first request: never the default role, own role while an attempt is open, else a clear error`, async () => {
      // The clients of one cell run at once, each in its own pod.
      const cell = await Promise.all(
        Object.keys(LATE_POD_CLIENTS).map((client) =>
          latePodTrial(harness, client, lateMs, `late-${client}-${lateMs}`),
        ),
      );
      trials.push(...cell);
      for (const trial of cell) {
        const what = `${trial.client}, pod ${lateMs} ms late`;
        assert.notEqual(trial.outcome, 'default', `${what}: got the default role`);
        assert.notEqual(trial.outcome, 'other', `${what}: got another role: ${trial.result.arn}`);
        assert.ok(trial.knownAtMs !== undefined, `${what}: the agent indexed the pod`);
        const expected = EXPECTED[trial.client]?.[lateMs];
        if (expected) assert.equal(trial.outcome, expected, `${what}: ${trial.result.error ?? trial.result.arn}`);
        if (trial.outcome === 'error') {
          // Not a timeout: every attempt the client made got the agent's 503 with its reason, and all of them ended before the pod was known.
          const refusals = trial.answers.filter((answer) => answer.status === 503);
          assert.ok(refusals.length > 0, `${what}: the agent answered 503`);
          assert.ok(
            refusals.every((answer) => answer.atMs <= (trial.knownAtMs as number)),
            `${what}: a 503 after the pod was known (${JSON.stringify(trial.answers)}, known at ${trial.knownAtMs})`,
          );
          assert.match(refusals.at(-1)?.reason ?? '', /^no pod on this node has IP /);
          assert.match(trial.result.error ?? '', CLEAR_ERROR[trial.client] as RegExp, `${what}: ${trial.result.error}`);
        }
      }
    });
  }

  it('held each client as long as its SDK waits', () => {
    const holdOf = (client: string) => [
      ...new Set(
        trials
          .filter((trial) => trial.client === client)
          .flatMap((trial) => trial.holds.map((hold) => `${hold.holdClient} ${hold.holdMs}`)),
      ),
    ];
    assert.deepEqual(holdOf('awscli'), ['botocore 750']);
    assert.deepEqual(holdOf('boto3'), ['botocore 750']);
    assert.deepEqual(holdOf('js-sdk-v3'), ['js-sdk-v3 750']);
    assert.deepEqual(holdOf('go-sdk-v1'), ['go-sdk-v1 750']);
    assert.deepEqual(holdOf('go-sdk-v2'), ['go-sdk-v2 300']);
  });
});
