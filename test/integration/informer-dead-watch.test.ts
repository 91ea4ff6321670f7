/**
 * An API server that vanishes without closing its connections (a network partition: no FIN, no
 * RST) leaves a watch stream open and silent. The informer must notice through its watch deadline,
 * report itself disconnected (so /readyz tells the truth), and catch up when the network heals.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { type AddressInfo, type Server, type Socket, connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ReplaySubject, type Subscription, filter, firstValueFrom, timeout } from 'rxjs';
import { type InformerEvent, informerEvents } from '../../src/cluster/informer.js';
import { kubeconfigConnection, kubeList } from '../../src/cluster/kube-connection.js';
import { type PodRecord, parsePod } from '../../src/cluster/pods.js';
import { FakeKubeApi } from '../../src/sandbox/kube-api/server.js';

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
    const kube = kubeconfigConnection(api.kubeconfigText().replace(api.url, relay.url), workDir);
    api.upsertPod({ metadata: { name: 'before' }, spec: { nodeName: 'node-a' }, status: { phase: 'Running', podIP: '10.0.0.1' } });
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

  const next = (match: (event: InformerEvent<PodRecord>) => boolean, timeoutMs = 15_000) => firstValueFrom(events.pipe(filter(match), timeout(timeoutMs)));

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
    console.log(`silent watch noticed after ${Math.round(performance.now() - partitionedAt)} ms (watch timeout 1 s + 0.5 s grace): ${error}`);
    api.upsertPod({ metadata: { name: 'during' }, spec: { nodeName: 'node-a' }, status: { phase: 'Running', podIP: '10.0.0.2' } });
    const arrived = next((event) => event.type === 'upsert' && event.object.name === 'during');
    const healedAt = performance.now();
    relay.heal();
    await arrived;
    console.log(`caught up ${Math.round(performance.now() - healedAt)} ms after the network healed`);
  });
});
