/**
 * The readiness taint's removal against the wire-level API server, including a concurrent
 * change to the node's taints between the agent's read and its patch; and the agent refusing
 * to start with a node configuration it cannot carry out.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { type KubeConnection, loadKubeConnection } from '../../src/cluster/kube-connection.js';
import { ConfigError, loadConfig } from '../../src/config/load.js';
import { FakeKubeApi } from '../../src/sandbox/kube-api/server.js';
import { createLogger } from '../../src/log.js';
import { startAgent } from '../../src/main.js';
import { MAX_TAINT_CONFLICTS, type NodeApi, nodeApi, removeNodeTaint } from '../../src/node/taint.js';

const NODE = 'node-a';
const READINESS = { key: 'kube-iam-broker/not-ready', effect: 'NoSchedule' } as const;
const OTHER = { key: 'example.com/maintenance', effect: 'NoSchedule' };

describe('readiness taint removal', () => {
  let api: FakeKubeApi;
  let workDir: string;
  let kube: KubeConnection;
  let nodes: NodeApi;

  before(async () => {
    [api, workDir] = await Promise.all([FakeKubeApi.start(), mkdtemp(join(tmpdir(), 'kib-taint-'))]);
    kube = loadKubeConnection(api.writeKubeconfig(workDir));
    nodes = nodeApi(kube);
  });
  after(async () => {
    await api?.stop();
    if (workDir) await rm(workDir, { recursive: true, force: true });
  });

  /** The API as the agent sees it, with someone else changing the node right after each read. */
  const racingApi = (concurrentChange: () => void): NodeApi => ({
    ...nodes,
    read: async (name) => {
      const node = await nodes.read(name);
      concurrentChange();
      return node;
    },
  });
  const patchesSince = (count: number) =>
    api.requests.slice(count).filter((request) => request.method === 'PATCH').length;

  it('keeps a taint added concurrently: the stale patch is refused, the node is read again, only the readiness taint goes', async () => {
    api.upsertNode({ metadata: { name: NODE }, spec: { taints: [READINESS] } });
    const requestsBefore = api.requests.length;
    let changed = false;
    const racing = racingApi(() => {
      if (changed) return;
      changed = true;
      api.upsertNode({ metadata: { name: NODE }, spec: { taints: [OTHER, READINESS] } });
    });
    assert.equal(await removeNodeTaint(racing, NODE, READINESS), 'removed');
    assert.deepEqual(api.getNode(NODE)?.spec?.taints, [OTHER]);
    assert.equal(patchesSince(requestsBefore), 2, 'one refused patch, one that applied');
  });

  it('gives up after a bounded number of conflicting changes, leaving the node as the others left it', async () => {
    api.upsertNode({ metadata: { name: NODE }, spec: { taints: [READINESS] } });
    const requestsBefore = api.requests.length;
    let flip = false;
    const racing = racingApi(() => {
      flip = !flip;
      api.upsertNode({ metadata: { name: NODE }, spec: { taints: flip ? [OTHER, READINESS] : [READINESS, OTHER] } });
    });
    await assert.rejects(
      removeNodeTaint(racing, NODE, READINESS),
      (error: { statusCode?: number }) => error.statusCode === 422,
    );
    assert.equal(patchesSince(requestsBefore), MAX_TAINT_CONFLICTS);
    assert.ok(api.getNode(NODE)?.spec?.taints?.some((taint) => taint.key === READINESS.key));
  });

  it('does not patch a node that has no such taint', async () => {
    api.upsertNode({ metadata: { name: NODE }, spec: { taints: [OTHER] } });
    const requestsBefore = api.requests.length;
    assert.equal(await removeNodeTaint(nodes, NODE, READINESS), 'absent');
    assert.equal(patchesSince(requestsBefore), 0);
  });

  it('the agent refuses to start with a node configuration it cannot carry out, and stops what it had started', async () => {
    const config = loadConfig([], {
      BROKER_LISTEN: '127.0.0.1:0',
      BROKER_ADMIN_LISTEN: '127.0.0.1:0',
      BROKER_METRICS_LISTEN: '127.0.0.1:0',
      BROKER_BASE_ROLE_ARN: 'arn:aws:iam::123456789012:role/',
      BROKER_METADATA_UPSTREAM: 'http://metadata.internal',
      BROKER_IPTABLES: 'true',
      BROKER_NODE_TAINT: `${READINESS.key}:${READINESS.effect}`,
    });
    const logs: string[] = [];
    const logger = createLogger('info', { write: (line: string) => void logs.push(line) });
    await assert.rejects(startAgent(config, { logger, kube }), (error: unknown) => {
      assert.ok(error instanceof ConfigError);
      assert.match(error.message, /BROKER_NODE_TAINT needs BROKER_NODE_NAME/);
      assert.match(error.message, /needs BROKER_HOST_INTERFACE/);
      assert.match(error.message, /loopback/);
      assert.match(error.message, /IPv4 address in BROKER_METADATA_UPSTREAM/);
      return true;
    });
    assert.ok(
      logs.some((line) => /kube-iam-broker stopped/.test(line)),
      'everything it started was stopped',
    );
  });
});
