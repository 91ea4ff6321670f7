/**
 * An API server that vanishes without closing its connections (a network partition: no FIN, no
 * RST) leaves a watch stream open and silent. The informer must notice through its watch deadline,
 * report itself disconnected (so /readyz tells the truth), and catch up when the network heals.
 * The agent on top must then stop answering from its stale index: a pod deleted during the
 * partition may have handed its IP to a new pod, which must never get the old pod's role.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { type AddressInfo, type Server, type Socket, connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ReplaySubject, type Subscription, filter, firstValueFrom, timeout } from 'rxjs';
import { type InformerEvent, informerEvents } from '../../src/cluster/informer.js';
import { type KubeConnection, kubeconfigConnection, kubeList } from '../../src/cluster/kube-connection.js';
import { type PodRecord, parsePod } from '../../src/cluster/pods.js';
import { loadConfig } from '../../src/config/load.js';
import { createLogger } from '../../src/log.js';
import { type RunningAgent, startAgent } from '../../src/main.js';
import { FakeKubeApi } from '../../src/sandbox/kube-api/server.js';
import { eventually } from '../../testkit/eventually.js';

/** A TCP relay to the API server that can silently stop relaying, as a partition does. */
class PartitionableRelay {
  private partitioned = false;
  private readonly pairs = new Set<[Socket, Socket]>();

  private constructor(readonly server: Server) {}

  static async start(target: URL): Promise<PartitionableRelay> {
    let relay: PartitionableRelay | undefined;
    const server = createServer((client) => relay?.accept(client, target));
    relay = new PartitionableRelay(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return relay;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  private accept(client: Socket, target: URL): void {
    const upstream = connect(Number(target.port), target.hostname);
    const pair: [Socket, Socket] = [client, upstream];
    this.pairs.add(pair);
    client.on('data', (chunk) => this.partitioned || upstream.write(chunk));
    upstream.on('data', (chunk) => this.partitioned || client.write(chunk));
    const end = () => {
      this.pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('close', end);
    client.on('error', end);
    // While partitioned, the API server closing its side (say, at a watch's timeoutSeconds) never reaches the client.
    const upstreamGone = () => (this.partitioned ? upstream.destroy() : end());
    upstream.on('close', upstreamGone);
    upstream.on('error', upstreamGone);
  }

  /** Bytes stop flowing both ways; every connection stays open. */
  partition(): void {
    this.partitioned = true;
  }

  /** Connections that lived through the partition are reset, as their peers' TCP state is long gone. */
  heal(): void {
    this.partitioned = false;
    for (const [client, upstream] of [...this.pairs]) {
      client.resetAndDestroy();
      upstream.destroy();
    }
  }

  async stop(): Promise<void> {
    this.heal();
    await new Promise((resolve) => this.server.close(resolve));
  }
}

/** A connection to the fake API server that goes through the relay. */
function connectionThrough(api: FakeKubeApi, relay: PartitionableRelay, workDir: string): KubeConnection {
  return kubeconfigConnection(api.kubeconfigText().replace(api.url, relay.url), workDir);
}

describe('informer against a partitioned API server', () => {
  let api: FakeKubeApi;
  let relay: PartitionableRelay;
  let workDir: string;
  let subscription: Subscription;
  const events = new ReplaySubject<InformerEvent<PodRecord>>();

  before(async () => {
    api = await FakeKubeApi.start();
    relay = await PartitionableRelay.start(new URL(api.url));
    workDir = await mkdtemp(join(tmpdir(), 'kib-dead-watch-'));
    const kube = connectionThrough(api, relay, workDir);
    api.upsertPod({
      metadata: { name: 'before' },
      spec: { nodeName: 'node-a' },
      status: { phase: 'Running', podIP: '10.0.0.1' },
    });
    subscription = informerEvents({
      kube,
      path: '/api/v1/pods',
      list: () => kubeList(kube, '/api/v1/pods'),
      parse: parsePod,
      // Seconds instead of minutes, so the test does not wait for the production deadline.
      watchTimeout: { serverSeconds: 1, graceMs: 500 },
    }).subscribe(events);
  });
  after(async () => {
    subscription?.unsubscribe();
    await relay?.stop();
    await api?.stop();
    if (workDir) await rm(workDir, { recursive: true, force: true });
  });

  const next = (match: (event: InformerEvent<PodRecord>) => boolean, timeoutMs = 15_000) =>
    firstValueFrom(events.pipe(filter(match), timeout(timeoutMs)));

  it('re-watches after the server ends a watch at timeoutSeconds, without reporting a disconnect', async () => {
    await next((event) => event.type === 'watching');
    const requestsBefore = api.requests.filter((request) => request.query.watch === 'true').length;
    await new Promise((resolve) => setTimeout(resolve, 2_500));
    const watches = api.requests.filter((request) => request.query.watch === 'true');
    assert.ok(watches.length > requestsBefore, 'the watch was renewed');
    assert.equal(watches.at(-1)?.query.timeoutSeconds, '1');
    const seen: Array<InformerEvent<PodRecord>['type']> = [];
    events.subscribe((event) => seen.push(event.type)).unsubscribe();
    assert.ok(!seen.includes('disconnected'), `a renewed watch is not a disconnect: ${seen.join(', ')}`);
  });

  it('reports a silent dead watch as disconnected, then catches up with what changed once the network heals', async () => {
    const disconnected = next((event) => event.type === 'disconnected');
    const partitionedAt = performance.now();
    relay.partition();
    const { error } = (await disconnected) as Extract<InformerEvent<PodRecord>, { type: 'disconnected' }>;
    console.log(
      `silent watch noticed after ${Math.round(performance.now() - partitionedAt)} ms (watch timeout 1 s + 0.5 s grace): ${error}`,
    );
    api.upsertPod({
      metadata: { name: 'during' },
      spec: { nodeName: 'node-a' },
      status: { phase: 'Running', podIP: '10.0.0.2' },
    });
    const arrived = next((event) => event.type === 'upsert' && event.object.name === 'during');
    const healedAt = performance.now();
    relay.heal();
    await arrived;
    console.log(`caught up ${Math.round(performance.now() - healedAt)} ms after the network healed`);
  });
});

describe('the agent during a partition: an IP reused while its watch is silently dead', () => {
  const NODE = 'node-a';
  /** The test's requests come from loopback: the pod that owns 127.0.0.1 is the caller. */
  const CALLER_IP = '127.0.0.1';
  const DEADLINE_SECONDS = 3;
  let api: FakeKubeApi;
  let relay: PartitionableRelay;
  let workDir: string;
  let agent: RunningAgent;

  before(async () => {
    api = await FakeKubeApi.start();
    relay = await PartitionableRelay.start(new URL(api.url));
    workDir = await mkdtemp(join(tmpdir(), 'kib-dead-watch-agent-'));
    api.upsertNamespace({ metadata: { name: 'default' } });
    api.upsertPod({
      metadata: { name: 'old', namespace: 'default', annotations: { 'iam.amazonaws.com/role': 'old-role' } },
      spec: { nodeName: NODE },
      status: { phase: 'Running', podIP: CALLER_IP },
    });
    const config = loadConfig([], {
      BROKER_NODE_NAME: NODE,
      BROKER_LISTEN: `${CALLER_IP}:0`,
      BROKER_ADMIN_LISTEN: '127.0.0.1:0',
      BROKER_BASE_ROLE_ARN: 'arn:aws:iam::123456789012:role/',
      BROKER_METADATA_UPSTREAM: 'http://127.0.0.1:9',
      // Seconds, so the test does not wait for the production deadline (30 s).
      BROKER_WATCH_DEADLINE: `${DEADLINE_SECONDS}s`,
    });
    agent = await startAgent(config, {
      logger: createLogger('warn', { write: () => undefined }),
      kube: connectionThrough(api, relay, workDir),
    });
  });
  after(async () => {
    await agent?.stop();
    await relay?.stop();
    await api?.stop();
    if (workDir) await rm(workDir, { recursive: true, force: true });
  });

  const door = async () => {
    const response = await fetch(
      `http://${CALLER_IP}:${agent.imds.address.port}/latest/meta-data/iam/security-credentials/`,
    );
    return { status: response.status, body: await response.text(), at: performance.now() };
  };
  const readyz = async () => (await fetch(`http://127.0.0.1:${agent.admin.address.port}/readyz`)).status;
  const pollDoor = async (until: (answer: Awaited<ReturnType<typeof door>>) => boolean, timeoutMs: number) => {
    const answers: Array<Awaited<ReturnType<typeof door>>> = [];
    const deadline = performance.now() + timeoutMs;
    while (performance.now() < deadline) {
      const answer = await door();
      answers.push(answer);
      if (until(answer)) return answers;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    throw new Error(`the metadata door did not change within ${timeoutMs} ms: ${JSON.stringify(answers.at(-1))}`);
  };

  it("answers the old role at most until the watch deadline, then a retryable 503 with the reason (and /readyz 503); the new pod's role once the network heals", async () => {
    await eventually('the agent to be ready', async () => (await readyz()) === 200, 30_000);
    assert.equal((await door()).body, 'old-role');

    const partitionedAt = performance.now();
    relay.partition();
    api.deletePod('default', 'old');
    api.upsertPod({
      metadata: { name: 'new', namespace: 'default', annotations: { 'iam.amazonaws.com/role': 'new-role' } },
      spec: { nodeName: NODE },
      status: { phase: 'Running', podIP: CALLER_IP },
    });

    const untilDoubt = await pollDoor((answer) => answer.status === 503, 30_000);
    const doubted = untilDoubt.at(-1) as Awaited<ReturnType<typeof door>>;
    const staleMs = doubted.at - partitionedAt;
    assert.ok(
      untilDoubt.slice(0, -1).every((answer) => answer.body === 'old-role'),
      'until then, the index as it was',
    );
    assert.match(doubted.body, /cannot vouch for its pods index .*retry/);
    assert.equal(await readyz(), 503, '/readyz says so too');
    // The bound is the watch deadline; the slack only absorbs a loaded machine's late timers.
    assert.ok(
      staleMs < DEADLINE_SECONDS * 2_000,
      `the old role was served ${Math.round(staleMs)} ms into the partition, past twice the ${DEADLINE_SECONDS} s deadline`,
    );

    const whilePartitioned = await Promise.all([door(), door(), door()]);
    assert.ok(
      whilePartitioned.every((answer) => answer.status === 503),
      'still 503 while partitioned',
    );

    const healedAt = performance.now();
    relay.heal();
    const afterHeal = await pollDoor((answer) => answer.status === 200, 30_000);
    assert.ok(
      afterHeal.slice(0, -1).every((answer) => answer.status === 503),
      `503 until caught up: ${JSON.stringify(afterHeal)}`,
    );
    assert.equal(afterHeal.at(-1)?.body, 'new-role', 'the new owner of the IP gets its own role, never the old one');
    console.log(
      `IP reuse during a partition (watch deadline ${DEADLINE_SECONDS} s): old role served for ${Math.round(staleMs)} ms, then 503 "${doubted.body}"; ` +
        `new role ${Math.round((afterHeal.at(-1)?.at ?? 0) - healedAt)} ms after the network healed`,
    );
  });
});
