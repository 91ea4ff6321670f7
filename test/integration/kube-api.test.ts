/**
 * Proves FakeKubeApi speaks the real Kubernetes wire protocol: the kubectl
 * binary and @kubernetes/client-node's ListWatch talk to it unmodified, and
 * injected faults surface to them the way real API-server faults do.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { describe, test, type TestContext } from 'node:test';
import { promisify } from 'node:util';
import { CoreV1Api, KubeConfig, ListWatch, Watch, type V1Pod } from '@kubernetes/client-node';
import type { PodInput } from '../../src/sandbox/kube-api/objects.js';
import { FakeKubeApi, type RecordedRequest } from '../../src/sandbox/kube-api/server.js';
import { eventually } from '../../testkit/eventually.js';

const run = promisify(execFile);
const KUBECTL = '/usr/bin/kubectl';

// ---- helpers ------------------------------------------------------------------

async function startApi(t: TestContext): Promise<FakeKubeApi> {
  const api = await FakeKubeApi.start();
  t.after(() => api.stop());
  return api;
}

function tempDir(t: TestContext): string {
  const dir = mkdtempSync(join(tmpdir(), 'kube-api-test-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

function pod(name: string, nodeName?: string, namespace = 'team-a'): PodInput {
  return {
    metadata: { name, namespace, annotations: { 'iam.amazonaws.com/role': `role-${name}` } },
    spec: { nodeName, serviceAccountName: 'default' },
    status: { phase: 'Running', podIP: '10.0.0.1', podIPs: [{ ip: '10.0.0.1' }] },
  };
}

async function kubectl(t: TestContext, api: FakeKubeApi, ...args: string[]): Promise<string> {
  const dir = tempDir(t);
  const base = ['--kubeconfig', api.writeKubeconfig(dir), '--cache-dir', join(dir, 'cache')];
  const { stdout } = await run(KUBECTL, [...base, ...args], { timeout: 20_000 });
  return stdout;
}

interface InformerEvent {
  verb: 'add' | 'update' | 'delete';
  name: string;
  at: number;
}

/** A client-node ListWatch over all pods, as the broker runs it, recording every callback. */
function podInformer(t: TestContext, api: FakeKubeApi, fieldSelector: string) {
  const kc = new KubeConfig();
  kc.loadFromFile(api.writeKubeconfig(tempDir(t)));
  const core = kc.makeApiClient(CoreV1Api);
  const informer = new ListWatch<V1Pod>(
    '/api/v1/pods',
    new Watch(kc),
    () => core.listPodForAllNamespaces({ fieldSelector }),
    false,
    undefined,
    fieldSelector,
  );
  const events: InformerEvent[] = [];
  const errors: unknown[] = [];
  for (const verb of ['add', 'update', 'delete'] as const) {
    informer.on(verb, (obj) => events.push({ verb, name: obj.metadata?.name ?? '', at: performance.now() }));
  }
  informer.on('error', (err) => errors.push(err));
  t.after(() => informer.stop());
  const saw = (verb: InformerEvent['verb'], name: string) => () =>
    events.some((e) => e.verb === verb && e.name === name);
  return { informer, events, errors, saw };
}

const isListOf = (path: string) => (r: RecordedRequest) =>
  r.method === 'GET' && r.path === path && r.query.watch === undefined;
const isWatchOf = (path: string) => (r: RecordedRequest) =>
  r.method === 'GET' && r.path === path && r.query.watch === 'true';

interface RawWatch {
  events: Array<{ type: string; object: { metadata?: { name?: string; resourceVersion?: string }; code?: number } }>;
  headers: Headers;
  /** Settles when the server ends the stream. */
  ended: Promise<void>;
}

/** Opens a watch with plain fetch and parses the newline-delimited JSON events as they arrive. */
async function rawWatch(t: TestContext, url: string): Promise<RawWatch> {
  const controller = new AbortController();
  t.after(() => controller.abort());
  const response = await fetch(url, { signal: controller.signal });
  assert.equal(response.status, 200);
  const { body } = response;
  assert.ok(body, 'watch response has a body');
  const events: RawWatch['events'] = [];
  const ended = (async () => {
    let buffered = '';
    for await (const chunk of body.pipeThrough(new TextDecoderStream())) {
      buffered += chunk;
      const lines = buffered.split('\n');
      buffered = lines.pop() ?? '';
      for (const line of lines) events.push(JSON.parse(line));
    }
  })();
  ended.catch(() => {}); // aborted by cleanup when the test doesn't wait for the end
  return { events, headers: response.headers, ended };
}

async function sendJson(url: string, method: string, contentType: string, body: unknown) {
  const response = await fetch(url, { method, headers: { 'Content-Type': contentType }, body: JSON.stringify(body) });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

// ---- tests --------------------------------------------------------------------

describe('FakeKubeApi', () => {
  test('kubectl discovers the API and lists pods, nodes and namespaces', async (t) => {
    const api = await startApi(t);
    api.upsertNamespace({ metadata: { name: 'team-a' } });
    api.upsertNode({ metadata: { name: 'node-a' } });
    api.upsertNode({ metadata: { name: 'node-b' } });
    api.upsertPod(pod('web', 'node-a'));
    api.upsertPod(pod('worker', 'node-b'));

    const all = JSON.parse(await kubectl(t, api, 'get', 'pods', '-A', '-o', 'json'));
    assert.deepEqual(
      all.items.map((p: V1Pod) => p.metadata?.name),
      ['web', 'worker'],
    );

    const onA = JSON.parse(
      await kubectl(t, api, 'get', 'pods', '-A', '--field-selector', 'spec.nodeName=node-a', '-o', 'json'),
    );
    assert.deepEqual(
      onA.items.map((p: V1Pod) => p.metadata?.name),
      ['web'],
    );

    assert.match(await kubectl(t, api, 'get', 'nodes'), /node-a[\s\S]*node-b/);
    assert.match(await kubectl(t, api, 'get', 'namespaces'), /team-a/);
  });

  test('client-node ListWatch follows pods on one node', async (t) => {
    const api = await startApi(t);
    api.upsertPod(pod('a-1', 'node-a'));
    api.upsertPod(pod('b-1', 'node-b'));
    const { informer, events, errors, saw } = podInformer(t, api, 'spec.nodeName=node-a');
    await informer.start();
    await eventually('initial list to deliver a-1', saw('add', 'a-1'));
    await eventually('the watch to be open', () => api.requests.some(isWatchOf('/api/v1/pods')));

    api.upsertPod(pod('b-2', 'node-b'));
    const upsertedAt = performance.now();
    api.upsertPod(pod('a-2', 'node-a'));
    await eventually('watch to deliver a-2', saw('add', 'a-2'));
    const latencyMs = (events.find((e) => e.name === 'a-2')?.at ?? NaN) - upsertedAt;
    t.diagnostic(`upsert -> ListWatch 'add' handler latency: ${latencyMs.toFixed(2)} ms`);

    api.upsertPod({ ...pod('a-2', 'node-a'), status: { phase: 'Succeeded' } });
    await eventually('modification of a-2', saw('update', 'a-2'));
    // Scheduling a pending pod onto node-a makes it enter the selection.
    api.upsertPod(pod('a-3'));
    api.upsertPod(pod('a-3', 'node-a'));
    await eventually('pending a-3 to arrive once bound to node-a', saw('add', 'a-3'));
    api.deletePod('team-a', 'a-2');
    await eventually('deletion of a-2', saw('delete', 'a-2'));

    assert.equal(events.filter((e) => e.name.startsWith('b-')).length, 0, 'pods on node-b never arrive');
    assert.deepEqual(errors, []);
  });

  test('lists filter by namespace, field and label selectors', async (t) => {
    const api = await startApi(t);
    api.upsertPod({ ...pod('web', 'node-a'), metadata: { name: 'web', namespace: 'team-a', labels: { app: 'web' } } });
    api.upsertPod({ ...pod('db', 'node-b'), metadata: { name: 'db', namespace: 'team-a', labels: { app: 'db' } } });
    api.upsertPod(pod('job', 'node-a', 'team-b'));
    const names = async (path: string) => {
      const response = await fetch(`${api.url}${path}`);
      assert.equal(response.status, 200, path);
      return ((await response.json()) as { items: V1Pod[] }).items.map((p) => p.metadata?.name);
    };

    assert.deepEqual(await names('/api/v1/namespaces/team-b/pods'), ['job']);
    assert.deepEqual(await names('/api/v1/pods?labelSelector=app%3Dweb'), ['web']);
    assert.deepEqual(await names('/api/v1/pods?labelSelector=app%21%3Dweb'), ['db', 'job']);
    assert.deepEqual(await names('/api/v1/pods?labelSelector=app'), ['db', 'web']);
    assert.deepEqual(await names('/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a,metadata.name%21%3Djob'), ['web']);
    assert.equal((await fetch(`${api.url}/api/v1/pods?labelSelector=app+in+(web)`)).status, 400);
  });

  test('raw watch replays from a resourceVersion and tracks the selection', async (t) => {
    const api = await startApi(t);
    const created = api.upsertPod(pod('p', 'node-a'));
    api.upsertPod(pod('other', 'node-b'));
    api.upsertPod({ ...pod('p', 'node-a'), status: { phase: 'Succeeded' } });
    const since = created.metadata.resourceVersion;
    const watch = await rawWatch(
      t,
      `${api.url}/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=${since}`,
    );
    assert.equal(watch.headers.get('content-type'), 'application/json');
    assert.equal(watch.headers.get('transfer-encoding'), 'chunked');

    const moved = api.upsertPod(pod('p', 'node-b'));
    await eventually('replayed MODIFIED then DELETED on leaving node-a', () => watch.events.length >= 2);
    assert.deepEqual(
      watch.events.map((e) => [e.type, e.object.metadata?.name]),
      [
        ['MODIFIED', 'p'],
        ['DELETED', 'p'],
      ],
    );
    assert.equal(watch.events[1]?.object.metadata?.resourceVersion, moved.metadata.resourceVersion);

    const timed = await rawWatch(t, `${api.url}/api/v1/nodes?watch=1&timeoutSeconds=1`);
    await timed.ended;
    assert.deepEqual(timed.events, [], 'a watch from "now" sends nothing old');
  });

  describe('faults', () => {
    test('compaction: open watches get 410 and the ListWatch relists', async (t) => {
      const api = await startApi(t);
      api.upsertPod(pod('stays', 'node-a'));
      api.upsertPod(pod('goes', 'node-a'));
      const oldRv = api.upsertPod(pod('elsewhere', 'node-b')).metadata.resourceVersion;
      const { informer, errors, saw } = podInformer(t, api, 'spec.nodeName=node-a');
      await informer.start();
      await eventually('the watch to be open', () => api.requests.some(isWatchOf('/api/v1/pods')));

      api.compact();
      // Same tick as compact(): the watch is already ended, so only a relist can reveal these.
      api.upsertPod(pod('new', 'node-a'));
      api.deletePod('team-a', 'goes');

      await eventually('relist to add the new pod', saw('add', 'new'));
      await eventually('relist to drop the deleted pod', saw('delete', 'goes'));
      assert.equal(api.requests.filter(isListOf('/api/v1/pods')).length, 2);
      assert.deepEqual(errors, []);

      const late = await rawWatch(t, `${api.url}/api/v1/pods?watch=true&resourceVersion=${oldRv}`);
      await late.ended;
      assert.deepEqual(
        late.events.map((e) => [e.type, e.object.code]),
        [['ERROR', 410]],
      );
    });

    test('dropped watch connections surface as ListWatch errors', async (t) => {
      const api = await startApi(t);
      const { informer, errors } = podInformer(t, api, 'spec.nodeName=node-a');
      await informer.start();
      await eventually('the watch to be open', () => api.requests.some(isWatchOf('/api/v1/pods')));
      api.dropWatches();
      await eventually('the error callback', () => errors.length > 0);
    });

    test('ended watches are resumed from the last resourceVersion', async (t) => {
      const api = await startApi(t);
      const { informer, errors, saw } = podInformer(t, api, 'spec.nodeName=node-a');
      await informer.start();
      await eventually('the watch to be open', () => api.requests.some(isWatchOf('/api/v1/pods')));
      api.endWatches();
      api.upsertPod(pod('after-end', 'node-a'));
      await eventually('the resumed watch to deliver the pod', saw('add', 'after-end'));
      assert.equal(api.requests.filter(isListOf('/api/v1/pods')).length, 1, 'no relist needed');
      assert.deepEqual(errors, []);
    });

    test('injected failures fail the list with the chosen status', async (t) => {
      const api = await startApi(t);
      api.failRequests(1);
      const { informer, errors } = podInformer(t, api, 'spec.nodeName=node-a');
      await informer.start();
      await eventually('the error callback', () => errors.length > 0);
      assert.equal((errors[0] as { code?: number }).code, 500);
      assert.equal((await fetch(`${api.url}/version`)).status, 200, 'only one request fails');
    });

    test('setDown refuses connections, then serves again on the same port', async (t) => {
      const api = await startApi(t);
      const url = api.url;
      await api.setDown(true);
      const refused = await fetch(`${url}/version`).then(
        () => undefined,
        (err: { cause?: { code?: string } }) => err.cause?.code,
      );
      assert.equal(refused, 'ECONNREFUSED');
      await api.setDown(false);
      assert.equal(api.url, url);
      const version = await fetch(`${url}/version`);
      assert.equal(((await version.json()) as { gitVersion: string }).gitVersion, 'v1.31.0');
    });
  });

  describe('node taint patches', () => {
    const taint = { key: 'iam-broker/not-ready', effect: 'NoSchedule' };
    const other = { key: 'dedicated', value: 'gpu', effect: 'NoExecute' };
    const patches = [
      { type: 'application/merge-patch+json', body: { spec: { taints: [other] } } },
      { type: 'application/strategic-merge-patch+json', body: { spec: { taints: [other] } } },
      {
        type: 'application/json-patch+json',
        body: [
          { op: 'test', path: '/spec/taints/0/key', value: taint.key },
          { op: 'remove', path: '/spec/taints/0' },
          { op: 'add', path: '/spec/taints/-', value: other },
        ],
      },
    ];

    for (const patch of patches) {
      test(`${patch.type} replaces the taints and notifies node watches`, async (t) => {
        const api = await startApi(t);
        api.upsertNode({ metadata: { name: 'node-a' }, spec: { taints: [taint] } });
        const watch = await rawWatch(t, `${api.url}/api/v1/nodes?watch=true`);

        const reply = await sendJson(`${api.url}/api/v1/nodes/node-a`, 'PATCH', patch.type, patch.body);
        assert.equal(reply.status, 200);
        assert.deepEqual(api.getNode('node-a')?.spec?.taints, [other]);
        assert.deepEqual(reply.body, api.getNode('node-a'));
        await eventually('MODIFIED on the node watch', () => watch.events.length > 0);
        assert.equal(watch.events[0]?.type, 'MODIFIED');
      });
    }

    test('a failing JSON patch test op is rejected and changes nothing', async (t) => {
      const api = await startApi(t);
      const before = api.upsertNode({ metadata: { name: 'node-a' }, spec: { taints: [taint] } });
      const reply = await sendJson(`${api.url}/api/v1/nodes/node-a`, 'PATCH', 'application/json-patch+json', [
        { op: 'test', path: '/spec/taints/0/key', value: 'something-else' },
        { op: 'replace', path: '/spec/taints', value: [] },
      ]);
      assert.equal(reply.status, 422);
      assert.equal(reply.body.kind, 'Status');
      assert.deepEqual(api.getNode('node-a'), before);
    });
  });

  test('events are recorded and errors are v1 Status objects', async (t) => {
    const api = await startApi(t);
    const event = { metadata: { generateName: 'web.' }, reason: 'CredentialsIssued', note: 'role-web' };
    const created = await sendJson(
      `${api.url}/apis/events.k8s.io/v1/namespaces/team-a/events`,
      'POST',
      'application/json',
      event,
    );
    assert.equal(created.status, 201);
    assert.deepEqual(api.createdEvents, [created.body]);
    assert.equal((created.body.metadata as { namespace: string }).namespace, 'team-a');

    const missing = await fetch(`${api.url}/api/v1/namespaces/team-a/pods/nope`);
    assert.equal(missing.status, 404);
    assert.equal(((await missing.json()) as { reason: string }).reason, 'NotFound');
    assert.equal((await fetch(`${api.url}/no/such/path`)).status, 404);

    const badJson = await fetch(`${api.url}/api/v1/namespaces/team-a/events`, { method: 'POST', body: '{nope' });
    assert.equal(badJson.status, 400);
    assert.equal(((await badJson.json()) as { kind: string }).kind, 'Status');
  });
});
