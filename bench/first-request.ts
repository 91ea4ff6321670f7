/**
 * First-request latency through the container-credentials door (issue 12), with and without
 * prefetch: a real agent per mode (BROKER_PREFETCH=arrival, then first-use), STS from moto, and
 * the fake API server signing each pod's projected token and answering its TokenReview. Each trial
 * creates a pod and, as soon as the agent has indexed it, curl in the pod's network namespace asks
 * the door with the pod's token: a TokenReview plus credentials, which must fit the SDKs' ~1 s.
 * Writes BENCHMARKS.md's first-request section. Run with `npm run bench:first-request` (inside
 * test/hermetic.sh, as root); FIRST_REQUEST_TRIALS sets the trials per mode (default 5).
 */
import { cpus } from 'node:os';
import { AgentHarness } from '../test/fixtures/agent.js';
import { curlInPod } from '../test/fixtures/clients.js';
import { FIRST_REQUEST, writeMarkedSection } from './kept-sections.js';

const DOOR = 'http://169.254.170.23/v1/credentials';
const MODES = ['arrival', 'first-use'] as const;
type Mode = (typeof MODES)[number];

const trialsPerMode = Number(process.env.FIRST_REQUEST_TRIALS ?? 5);
if (!Number.isInteger(trialsPerMode) || trialsPerMode < 1 || trialsPerMode > 100)
  throw new Error('FIRST_REQUEST_TRIALS must be a whole number from 1 to 100');

/** Milliseconds of each trial's first request (curl's total time), for one prefetch mode. */
async function firstRequests(mode: Mode): Promise<number[]> {
  const harness = await AgentHarness.create();
  try {
    const pod = await harness.addNetnsPod('first');
    await harness.startAgent({
      BROKER_PREFETCH: mode,
      BROKER_CONTAINER_LISTEN: '169.254.170.23:80',
      // As in the integration tests: no dummy link type in the hermetic namespace.
      BROKER_CONTAINER_LINK: 'lo',
      BROKER_LOG_LEVEL: 'warn',
    });
    await harness.waitUntilReady();
    const latencies: number[] = [];
    for (let trial = 0; trial < trialsPerMode; trial++) {
      // A new pod (its own session, nothing cached) on the same network namespace; the previous one is gone.
      const name = `${mode}-${trial}`;
      if (trial > 0) harness.api.deletePod('default', `${mode}-${trial - 1}`);
      harness.schedulePod({ name, role: `app-${name}`, ip: pod.ip });
      await harness.nextEvent((event) => event.type === 'pod.indexed' && event.pod === name);
      const token = harness.api.issueToken('default', name, { audiences: ['kube-iam-broker'] });
      const result = await curlInPod(pod, [
        '--output',
        '/dev/null',
        '--write-out',
        '%{http_code} %{time_total}',
        '-H',
        `Authorization: ${token}`,
        DOOR,
      ]);
      const [status, seconds] = result.stdout.split(' ');
      if (status !== '200') throw new Error(`${name}: HTTP ${status} ${result.stderr}`);
      latencies.push(Number(seconds) * 1000);
      console.log(`${name}: ${(Number(seconds) * 1000).toFixed(1)} ms`);
    }
    return latencies;
  } finally {
    await harness.stop();
  }
}

const results: Record<Mode, number[]> = { arrival: [], 'first-use': [] };
for (const mode of MODES) results[mode] = await firstRequests(mode);

const ms = (value: number) => `${value.toFixed(1)} ms`;
const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor((sorted.length - 1) / 2)] ?? NaN;
};
const section = [
  FIRST_REQUEST.begin,
  '## First request through the container-credentials door, with and without prefetch',
  `${cpus().length} CPUs, Node ${process.version}, ${new Date().toISOString().slice(0, 10)}; ${trialsPerMode} trial(s) per mode, each a new pod. curl in the pod's network namespace sends GET ${DOOR} with the pod's projected token as soon as the agent has indexed the pod; the time is curl's total (TokenReview against the fake API server, then the credentials: from the prefetch under arrival, from an AssumeRole to moto under first-use). The SDKs wait about 1 s per attempt.`,
  '',
  '| BROKER_PREFETCH | p50 | max | trials (ms) |',
  '|---|---|---|---|',
  ...MODES.map(
    (mode) =>
      `| ${mode} | **${ms(median(results[mode]))}** | ${ms(Math.max(...results[mode]))} | ${results[mode].map((value) => value.toFixed(0)).join(', ')} |`,
  ),
  FIRST_REQUEST.end,
].join('\n');
await writeMarkedSection(FIRST_REQUEST, section);
