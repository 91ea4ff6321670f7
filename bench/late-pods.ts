/**
 * The issue-10 table with more trials than the integration test runs: real SDK clients in pods
 * (awscli, boto3, JS SDK v3, Go SDK v1 and v2), a default role configured, each pod known to the
 * agent 150 ms, 600 ms or 1.2 s after its client's first request. Counts own role / default role
 * (wrong) / no credentials per cell and per client, and writes them to BENCHMARKS.md between the
 * late-pods markers. Run with `npm run bench:late-pods` (inside test/hermetic.sh, as root);
 * LATE_POD_TRIALS sets the trials per client and cell (default 3: 45 trials, about 2 minutes).
 */
import { cpus } from 'node:os';
import { AgentHarness } from '../test/fixtures/agent.js';
import { goClientBinary } from '../test/fixtures/go-clients.js';
import {
  DEFAULT_ROLE,
  LATE_MS,
  LATE_POD_CLIENTS,
  type LatePodTrial,
  latePodTrial,
} from '../test/fixtures/late-pods.js';
import { LATE_PODS, writeMarkedSection } from './kept-sections.js';

const trialsPerCell = Number(process.env.LATE_POD_TRIALS ?? 3);
if (!Number.isInteger(trialsPerCell) || trialsPerCell < 1 || trialsPerCell > 50)
  throw new Error('LATE_POD_TRIALS must be a whole number from 1 to 50');

const started = performance.now();
await Promise.all([goClientBinary('v1'), goClientBinary('v2')]);
const harness = await AgentHarness.create();
const trials: LatePodTrial[] = [];
try {
  await harness.startAgent({ BROKER_DEFAULT_ROLE: DEFAULT_ROLE, BROKER_LOG_LEVEL: 'warn' });
  await harness.waitUntilReady();
  for (let round = 0; round < trialsPerCell; round++) {
    for (const lateMs of LATE_MS) {
      const cell = await Promise.all(
        Object.keys(LATE_POD_CLIENTS).map((client) =>
          latePodTrial(harness, client, lateMs, `b${round}-${client}-${lateMs}`),
        ),
      );
      trials.push(...cell);
      for (const trial of cell)
        console.log(
          `${trial.client} ${lateMs} ms: ${trial.outcome}${trial.result.ok ? '' : ` (${trial.result.error})`}`,
        );
    }
  }
} finally {
  await harness.stop();
}

const count = (subset: LatePodTrial[]) =>
  `${subset.filter((t) => t.outcome === 'own').length} / ${subset.filter((t) => t.outcome === 'default' || t.outcome === 'other').length} / ${subset.filter((t) => t.outcome === 'error').length}`;
const clients = Object.keys(LATE_POD_CLIENTS);
const section = [
  LATE_PODS.begin,
  '## Pods known late, real SDK clients (the issue-10 table)',
  `${cpus().length} CPUs, Node ${process.version}, ${new Date().toISOString().slice(0, 10)}; ${trialsPerCell} trial(s) per client and cell, the five clients of a cell at once, each in its own pod (network namespace). A default role is configured; each pod is created in the API server 150 ms, 600 ms or 1.2 s after its client's first request. Cells: own role / wrong role (default or other) / no credentials.`,
  '',
  `| pod known after | all clients | ${clients.join(' | ')} |`,
  `|---|---|${clients.map(() => '---').join('|')}|`,
  ...LATE_MS.map((lateMs) => {
    const cell = trials.filter((t) => t.lateMs === lateMs);
    return `| ${lateMs} ms | ${count(cell)} | ${clients.map((client) => count(cell.filter((t) => t.client === client))).join(' | ')} |`;
  }),
  `| total | **${count(trials)}** | ${clients.map((client) => count(trials.filter((t) => t.client === client))).join(' | ')} |`,
  '',
  `Whole run: ${Math.round((performance.now() - started) / 1000)} s.`,
  LATE_PODS.end,
].join('\n');
await writeMarkedSection(LATE_PODS, section);
