/**
 * Fairness under load (issue 11 item 5, issue 17 item 1): one pod hammering the metadata port
 * against another pod's cached credential GETs, with the per-caller rate limit at its default and,
 * for comparison, effectively off. The well-behaved pod makes one GET every 20 ms on a new
 * connection (as a fresh SDK client does); its p50/p99 idle and under the hammering are reported.
 * The agent is the real one (a child process); pods are network namespaces.
 *   npm run bench:fairness   (runs inside test/hermetic.sh; writes bench/results/fairness.md)
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { FakeKubeApi } from '../src/sandbox/kube-api/server.js';
import { BASE_ROLE_ARN, NODE } from '../test/fixtures/agent.js';
import { eventually } from '../testkit/eventually.js';
import { Moto, motoEnv } from '../testkit/moto.js';
import { type NetnsPod, PodNetwork } from '../test/fixtures/netns.js';
import { ChildAgent } from '../test/fixtures/node.js';

const LOAD_SCRIPT = fileURLToPath(new URL('../test/fixtures/metadata-load.mjs', import.meta.url));
const PORT = 8181;
const ADMIN = '127.0.0.1:18183';
const RUN_MS = 8_000;
const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';

interface Steady {
  readonly statuses: Record<string, number>;
  readonly failed: number;
  readonly p50: number;
  readonly p99: number;
}
interface Flood {
  readonly statuses: Record<string, number>;
  readonly answered: number;
}

const network = await PodNetwork.create();
const [api, moto, workDir] = await Promise.all([
  FakeKubeApi.start(),
  Moto.start(network.nodeIp),
  mkdtemp(join(tmpdir(), 'kib-fairness-')),
]);
const [quiet, hammer] = await Promise.all([network.addPod('quiet'), network.addPod('hammer')]);
api.upsertNamespace({ metadata: { name: 'default' } });
for (const [pod, name] of [
  [quiet, 'quiet'],
  [hammer, 'hammer'],
] as const) {
  api.upsertPod({
    metadata: { name, namespace: 'default', annotations: { 'iam.amazonaws.com/role': `${name}-role` } },
    spec: { nodeName: NODE, serviceAccountName: 'app' },
    status: { phase: 'Running', podIP: pod.ip, podIPs: [{ ip: pod.ip }] },
  });
}

const load = async <T>(pod: NetnsPod, options: Record<string, unknown>): Promise<T> => {
  const result = await pod.exec(
    [process.execPath, LOAD_SCRIPT, JSON.stringify({ host: network.nodeIp, port: PORT, ...options })],
    { timeoutMs: RUN_MS + 30_000 },
  );
  if (result.code !== 0) throw new Error(`load in ${pod.name} failed: ${result.stderr}`);
  return JSON.parse(result.stdout) as T;
};
const quietLoad = () =>
  load<Steady>(quiet, {
    mode: 'steady',
    durationMs: RUN_MS,
    intervalMs: 20,
    request: { path: `${CREDENTIALS}quiet-role` },
  });
const hammering = () =>
  load<Flood>(hammer, {
    mode: 'flood',
    connections: 50,
    pipeline: 1,
    durationMs: RUN_MS,
    request: { path: `${CREDENTIALS}hammer-role` },
  });

const rows: Array<Record<string, string | number>> = [];
try {
  for (const [label, env] of [
    ['default limit (100/s, burst 200)', {}],
    ['limit effectively off', { BROKER_CALLER_RATE: '1000000', BROKER_CALLER_BURST: '1000000' }],
  ] as const) {
    const agent = ChildAgent.start({
      ...motoEnv(moto.endpoint),
      KUBECONFIG: api.writeKubeconfig(workDir),
      BROKER_NODE_NAME: NODE,
      BROKER_LISTEN: `${network.nodeIp}:${PORT}`,
      BROKER_ADMIN_LISTEN: ADMIN,
      BROKER_METRICS_LISTEN: '127.0.0.1:0',
      BROKER_BASE_ROLE_ARN: BASE_ROLE_ARN,
      BROKER_METADATA_UPSTREAM: 'http://127.0.0.1:9',
      ...env,
    });
    try {
      await eventually(
        'the agent is ready',
        async () => (await fetch(`http://${ADMIN}/readyz`).catch(() => undefined))?.status === 200,
        90_000,
      );
      await load<Steady>(quiet, {
        mode: 'steady',
        durationMs: 1_000,
        intervalMs: 50,
        request: { path: `${CREDENTIALS}quiet-role` },
      });
      await load<Steady>(hammer, {
        mode: 'steady',
        durationMs: 1_000,
        intervalMs: 50,
        request: { path: `${CREDENTIALS}hammer-role` },
      });
      const idle = await quietLoad();
      const [loaded, flood] = await Promise.all([quietLoad(), hammering()]);
      rows.push({
        'per-caller limit': label,
        'quiet pod p50 idle (ms)': idle.p50,
        'p99 idle (ms)': idle.p99,
        'p50 under hammering (ms)': loaded.p50,
        'p99 under hammering (ms)': loaded.p99,
        'p99 ratio': Number((loaded.p99 / Math.max(1, idle.p99)).toFixed(2)),
        'quiet pod failures':
          loaded.failed +
          Object.entries(loaded.statuses)
            .filter(([code]) => code !== '200')
            .reduce((sum, [, n]) => sum + n, 0),
        'hammer answers/s': Math.round(flood.answered / (RUN_MS / 1000)),
        'hammer 429 share': `${Math.round((100 * (flood.statuses['429'] ?? 0)) / Math.max(1, flood.answered))} %`,
      });
    } finally {
      await agent.kill();
    }
  }
} finally {
  await Promise.all([api.stop(), moto.stop(), network.destroy(), rm(workDir, { recursive: true, force: true })]);
}
const headers = Object.keys(rows[0] ?? {});
const report = [
  "## Fairness: one pod hammering, another pod's cached GET",
  '',
  `Produced by \`npm run bench:fairness\` (bench/fairness.ts) on ${cpus().length} CPUs (${cpus()[0]?.model.trim()}), Node ${process.version}, ${new Date().toISOString().slice(0, 10)}; shared with other work while running: figures are indicative.`,
  `The real agent (child process, shipped defaults but the limit), pods as network namespaces. The hammering pod: 50 keep-alive connections, each sending its next cached GET as soon as the last is answered (a 429 closes its connection; it reconnects after 10 ms). The quiet pod: one cached GET every 20 ms on a new connection, ${RUN_MS / 1000} s idle, then ${RUN_MS / 1000} s under the hammering. Target (issue 11): p99 under hammering ≤ 2× idle.`,
  '',
  `| ${headers.join(' | ')} |`,
  `|${headers.map(() => '---').join('|')}|`,
  ...rows.map((row) => `| ${headers.map((header) => String(row[header])).join(' | ')} |`),
  '',
];
await mkdir(new URL('results/', import.meta.url), { recursive: true });
await writeFile(new URL('results/fairness.md', import.meta.url), report.join('\n'));
console.log(report.join('\n'));
