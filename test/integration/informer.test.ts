/**
 * The real @kubernetes/client-node informer (through src/cluster) against the wire-level API
 * server: list, chunked watch, fieldSelector, 410 relists, cut streams and failing requests.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, beforeEach, describe, it } from 'node:test';
import type { Subscription } from 'rxjs';
import type { InformerEvent } from '../../src/cluster/informer.js';
import { type KubeConnection, loadKubeConnection } from '../../src/cluster/kube-connection.js';
import { type PodRecord, podEvents } from '../../src/cluster/pods.js';
import type { PodInput } from '../../src/sandbox/kube-api/objects.js';
import { FakeKubeApi } from '../../src/sandbox/kube-api/server.js';
import { eventually } from '../../testkit/eventually.js';

const pod = (name: string, nodeName: string, ip?: string): PodInput => ({
  metadata: { name, namespace: 'default' },
  spec: { nodeName },
  status: { phase: 'Running', ...(ip ? { podIP: ip } : {}) },
});

describe('pod informer against the wire-level API server', () => {
  let api: FakeKubeApi;
  let workDir: string;
  let kube: KubeConnection;
  let events: Array<InformerEvent<PodRecord>>;
  let subscription: Subscription | undefined;

  const names = (type: 'upsert' | 'delete') =>
    events.flatMap((event) => (event.type === type ? [event.object.name] : []));
  const count = (type: InformerEvent<PodRecord>['type']) => events.filter((event) => event.type === type).length;
  const start = () => {
    subscription = podEvents(kube, 'node-a').subscribe((event) => events.push(event));
    return eventually('the informer has synced and is watching', () => count('synced') > 0 && count('watching') > 0);
  };

  before(async () => {
    api = await FakeKubeApi.start();
    workDir = await mkdtemp(join(tmpdir(), 'kib-informer-'));
    kube = loadKubeConnection(api.writeKubeconfig(workDir));
  });
  beforeEach(() => {
    subscription?.unsubscribe();
    events = [];
    for (const existing of api.pods()) api.deletePod(existing.metadata.namespace, existing.metadata.name);
  });
  after(async () => {
    subscription?.unsubscribe();
    await api.stop();
    await rm(workDir, { recursive: true, force: true });
  });

  it('lists and then watches only the pods on its node, validated into records', async () => {
    api.upsertPod(pod('here', 'node-a', '10.0.0.1'));
    api.upsertPod(pod('elsewhere', 'node-b', '10.0.0.2'));
    await start();
    assert.deepEqual(names('upsert'), ['here']);
    const listRequest = api.requests.find(
      (request) => request.path === '/api/v1/pods' && request.query.watch === undefined,
    );
    assert.equal(listRequest?.query.fieldSelector, 'spec.nodeName=node-a');
    api.upsertPod(pod('arrives', 'node-a', '10.0.0.3'));
    api.upsertPod(pod('other-node', 'node-b', '10.0.0.4'));
    await eventually('the watched pod arrives', () => names('upsert').includes('arrives'));
    assert.ok(!names('upsert').includes('other-node'));
    const record = events.find((event) => event.type === 'upsert' && event.object.name === 'arrives');
    assert.ok(record?.type === 'upsert');
    assert.deepEqual(record.object.ips, ['10.0.0.3']);
    api.deletePod('default', 'arrives');
    await eventually('the delete arrives', () => names('delete').includes('arrives'));
  });

  it('relists after a 410 and reports the pods that vanished meanwhile as deletes', async () => {
    api.upsertPod(pod('stays', 'node-a', '10.0.0.1'));
    api.upsertPod(pod('vanishes', 'node-a', '10.0.0.2'));
    await start();
    const listsBefore = api.requests.filter(
      (request) => request.path === '/api/v1/pods' && request.query.watch === undefined,
    ).length;
    api.dropWatches();
    api.deletePod('default', 'vanishes');
    api.compact();
    await eventually('a relist reports the vanished pod', () => names('delete').includes('vanishes'), 10_000);
    const listsAfter = api.requests.filter(
      (request) => request.path === '/api/v1/pods' && request.query.watch === undefined,
    ).length;
    assert.ok(listsAfter > listsBefore, 'listed again');
    assert.ok(!names('delete').includes('stays'));
  });

  it('restarts a cut watch stream and misses no event from the gap', async () => {
    await start();
    api.dropWatches();
    api.upsertPod(pod('during-gap', 'node-a', '10.0.0.5'));
    await eventually(
      'the informer reconnected and replayed the gap',
      () => names('upsert').includes('during-gap'),
      10_000,
    );
    assert.ok(count('disconnected') >= 1, 'the cut was reported');
  });

  it('retries after HTTP 500 and refused connections until the API server is back', async () => {
    api.failRequests(3, 500);
    await start();
    assert.ok(count('disconnected') >= 1, 'the failures were reported');
    await api.setDown(true);
    await eventually('the outage was noticed', () => events.at(-1)?.type === 'disconnected', 10_000);
    await api.setDown(false);
    api.upsertPod(pod('after-outage', 'node-a', '10.0.0.6'));
    await eventually('the informer recovered', () => names('upsert').includes('after-outage'), 10_000);
  });

  it('reports an object that does not validate instead of passing it on', async () => {
    await start();
    api.upsertPod({
      metadata: { name: 'bad', namespace: 'default', creationTimestamp: 'yesterday' },
      spec: { nodeName: 'node-a' },
    });
    await eventually('the invalid object was reported', () => count('invalid') > 0);
    const invalid = events.find((event) => event.type === 'invalid');
    assert.ok(invalid?.type === 'invalid');
    assert.match(invalid.reason, /default\/bad/);
  });

  it('renews a quiet watch from the bookmark the API server sent, so compacting the changes it did not select forces no relist', async () => {
    subscription = podEvents(kube, 'node-a', undefined, { serverSeconds: 1, graceMs: 500 }).subscribe((event) =>
      events.push(event),
    );
    await eventually('the informer has synced and is watching', () => count('synced') > 0 && count('watching') > 0);
    const lists = () =>
      api.requests.filter((request) => request.path === '/api/v1/pods' && request.query.watch === undefined).length;
    const watches = () =>
      api.requests.filter((request) => request.path === '/api/v1/pods' && request.query.watch === 'true');
    const listsBefore = lists();
    assert.equal(watches().at(-1)?.query.allowWatchBookmarks, 'true', 'the informer asks for bookmarks');
    // Changes on another node: this watch selects none of them, yet they advance the resourceVersion.
    for (const name of ['busy-1', 'busy-2', 'busy-3']) api.upsertPod(pod(name, 'node-b', '10.0.9.1'));
    const reached = String(api.currentResourceVersion);
    await eventually(
      'a watch renewed from the bookmark',
      () => watches().some((request) => request.query.resourceVersion === reached),
      10_000,
    );
    api.compactThrough(api.currentResourceVersion - 1);
    const watchesAtCompaction = watches().length;
    await eventually('two more renewals', () => watches().length >= watchesAtCompaction + 2, 10_000);
    assert.equal(lists(), listsBefore, 'no relist: the renewed watches were never too old');
    assert.equal(count('synced'), 1);
    assert.equal(count('disconnected'), 0);
  });
});
