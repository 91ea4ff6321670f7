/**
 * The agent on a node: its DNAT rule (installed, idempotent across restarts and crashes, kept
 * in place, removed at exit), the keep-alive connections that predate it, and the readiness
 * taint. The agent runs as a child process, pods are network namespaces on a bridge, and the
 * node's metadata service is a stand-in on 169.254.169.254:80 in the test's own namespace.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import { FakeKubeApi } from '../../src/sandbox/kube-api/server.js';
import { BASE_ROLE_ARN, NODE } from '../fixtures/agent.js';
import { type NetnsPod, PodNetwork, requireHermetic } from '../fixtures/netns.js';
import { ChildAgent, type ClientAnswer, KeepAliveClient, METADATA_ADDRESS, NodeMetadataService, brokerNatRules, removeBrokerRule, sh, trackConnectionsLikeANode, withTimeout } from '../fixtures/node.js';
import { eventually } from '../../testkit/eventually.js';

const CREDENTIALS_URL = `http://${METADATA_ADDRESS}/latest/meta-data/iam/security-credentials/`;
const READINESS_TAINT = { key: 'kube-iam-broker/not-ready', effect: 'NoSchedule' };
const OTHER_TAINT = { key: 'example.com/maintenance', value: 'soon', effect: 'PreferNoSchedule' };
const fromAgent = (answer: ClientAnswer) => answer.body === 'app-role';
const fromNode = (answer: ClientAnswer) => answer.body === 'node-role';

describe('node integration: the DNAT rule, stale connections and the readiness taint', () => {
  let api: FakeKubeApi;
  let network: PodNetwork;
  let metadata: NodeMetadataService;
  let pod: NetnsPod;
  let workDir: string;
  let stopTracking: () => Promise<void>;
  const agents: ChildAgent[] = [];

  const startAgent = (env: Record<string, string> = {}) => {
    const agent = ChildAgent.start({
      KUBECONFIG: api.writeKubeconfig(workDir),
      BROKER_NODE_NAME: NODE,
      BROKER_LISTEN: `${network.nodeIp}:8181`,
      BROKER_ADMIN_LISTEN: '127.0.0.1:0',
      BROKER_METRICS_LISTEN: '127.0.0.1:0',
      BROKER_BASE_ROLE_ARN: BASE_ROLE_ARN,
      // The metadata address the rule redirects: the stand-in inside this test's namespace.
      BROKER_METADATA_UPSTREAM: `http://${METADATA_ADDRESS}`,
      BROKER_IPTABLES: 'true',
      BROKER_HOST_IP: network.nodeIp,
      // Pods sit on a bridge: at the IP layer their packets arrive on it (docker0, cbr0 on a node).
      BROKER_HOST_INTERFACE: network.bridge,
      ...env,
    });
    agents.push(agent);
    return agent;
  };

  before(async () => {
    requireHermetic();
    stopTracking = await trackConnectionsLikeANode();
    [api, network, metadata, workDir] = await Promise.all([FakeKubeApi.start(), PodNetwork.create(), NodeMetadataService.start(), mkdtemp(join(tmpdir(), 'kib-node-'))]);
    pod = await network.addPod('app');
    api.upsertNamespace({ metadata: { name: 'default' } });
    api.upsertPod({
      metadata: { name: 'app', namespace: 'default', annotations: { 'iam.amazonaws.com/role': 'app-role' } },
      spec: { nodeName: NODE, serviceAccountName: 'app' },
      status: { phase: 'Running', podIP: pod.ip, podIPs: [{ ip: pod.ip }] },
    });
  });

  // An agent or a rule a failed test left behind would hold the port and the rule for the next test.
  afterEach(async () => {
    for (const agent of agents.splice(0)) await agent.kill();
    await removeBrokerRule();
  });

  after(async () => {
    await Promise.all([api?.stop(), metadata?.stop(), network?.destroy(), workDir && rm(workDir, { recursive: true, force: true })]);
    await stopTracking?.();
  });

  it('moves a keep-alive client that predates the agent onto the agent, without restarting the client', async () => {
    const client = KeepAliveClient.start(pod, CREDENTIALS_URL);
    try {
      await client.waitForAnswers('the client to talk to the node\'s metadata service', (answers) => answers.filter(fromNode).length >= 5);
      const { stdout: tracked } = await sh('conntrack', '-L', '-p', 'tcp', '--orig-dst', METADATA_ADDRESS);
      assert.match(tracked, new RegExp(`ESTABLISHED src=${pod.ip.replace(/\./g, '\\.')} dst=${METADATA_ADDRESS}`), 'the client\'s connection is tracked to the old destination');

      const agent = startAgent();
      const dropped = await agent.waitForLog('the stale connections to be dropped', agent.event('node.conntrack', 'dropped'));
      assert.ok((dropped.count ?? 0) >= 1, `dropped ${dropped.count} entries`);
      await client.waitForAnswers('the client to reach the agent', (answers) => answers.filter(fromAgent).length >= 5);

      const answers = [...client.answers];
      const firstFromAgent = answers.findIndex(fromAgent);
      const before = answers.slice(0, firstFromAgent);
      const since = answers.slice(firstFromAgent);
      assert.equal(new Set(before.filter(fromNode).map((answer) => answer.localPort)).size, 1, 'before the agent: one keep-alive connection, reused');
      assert.ok(since.every(fromAgent), `once on the agent, every answer comes from it: ${JSON.stringify(since.filter((answer) => !fromAgent(answer)))}`);
      const failedBetween = before.filter((answer) => answer.error !== undefined);
      assert.ok(failedBetween.length <= 1, `at most the one request on the reset connection fails: ${JSON.stringify(failedBetween)}`);
      const switchMs = (answers[firstFromAgent] as ClientAnswer).at - Date.parse(dropped.time);
      const lastFromNode = before.filter(fromNode).at(-1) as ClientAnswer;
      console.log(
        `stale keep-alive connection: first answer from the agent ${switchMs} ms after the conntrack drop (${dropped.count} entries dropped); ` +
          `last answer from the node's service ${lastFromNode.at - Date.parse(dropped.time)} ms relative to the drop; ${failedBetween.length} request(s) failed in between`,
      );
      assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
    } finally {
      await client.stop();
    }
  });

  it('without dropping connections (BROKER_DROP_CONNECTIONS=false) the same client keeps reaching the node\'s service: the bug the drop fixes', async () => {
    const client = KeepAliveClient.start(pod, CREDENTIALS_URL);
    try {
      await client.waitForAnswers('the client to talk to the node\'s metadata service', (answers) => answers.filter(fromNode).length >= 3);
      const agent = startAgent({ BROKER_DROP_CONNECTIONS: 'false' });
      const installed = await agent.waitForLog('the rule to be installed', agent.event('node.iptables', 'installed'));
      const installedAt = Date.parse(installed.time);
      await client.waitForAnswers('20 answers after the rule was installed', (answers) => answers.filter((answer) => answer.at > installedAt).length >= 20);
      const afterRule = client.answers.filter((answer) => answer.at > installedAt);
      assert.ok(afterRule.every(fromNode), `every answer after the rule still came from the node's service: ${JSON.stringify(afterRule.filter((answer) => !fromNode(answer)))}`);
      assert.ok(!agent.logs.some(agent.event('node.conntrack')), 'nothing was dropped');
      assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
    } finally {
      await client.stop();
    }
  });

  it('installs the rule once across two starts and a kill -9, rewrites it for a new port, and removes it on SIGTERM', async () => {
    const first = startAgent();
    await first.waitForLog('the rule to be installed', first.event('node.iptables', 'installed'));
    assert.deepEqual(await first.signal('SIGKILL'), { code: null, signal: 'SIGKILL' });
    let rules = await brokerNatRules();
    assert.equal(rules.jumps.length, 1, 'a crash leaves the rule behind');

    const second = startAgent();
    await second.waitForLog('the rule to be found in place', second.event('node.iptables', 'in-place'));
    rules = await brokerNatRules();
    assert.deepEqual([rules.jumps.length, rules.dnats.length], [1, 1], `one jump and one DNAT: ${JSON.stringify(rules)}`);
    assert.match(rules.dnats[0] as string, new RegExp(`-i ${network.bridge} .*--dport 80 .*--to-destination ${network.nodeIp.replace(/\./g, '\\.')}:8181`));
    assert.deepEqual(await second.signal('SIGKILL'), { code: null, signal: 'SIGKILL' });

    const moved = startAgent({ BROKER_LISTEN: `${network.nodeIp}:8282` });
    await moved.waitForLog('the rule to be rewritten', moved.event('node.iptables', 'installed'));
    rules = await brokerNatRules();
    assert.deepEqual([rules.jumps.length, rules.dnats.length], [1, 1], `still one jump and one DNAT: ${JSON.stringify(rules)}`);
    assert.match(rules.dnats[0] as string, /--to-destination [\d.]+:8282$/);
    const response = await pod.exec(['curl', '-sS', '--max-time', '5', CREDENTIALS_URL]);
    assert.equal(response.stdout, 'app-role', 'a new connection from the pod reaches the agent on its new port');

    assert.deepEqual(await moved.signal('SIGTERM'), { code: 0, signal: null });
    rules = await brokerNatRules();
    assert.deepEqual(rules, { jumps: [], dnats: [] }, 'removed on exit');
    assert.ok(moved.logs.some(moved.event('node.iptables', 'removed')));
    const afterExit = await pod.exec(['curl', '-sS', '--max-time', '5', CREDENTIALS_URL]);
    assert.equal(afterExit.stdout, 'node-role', 'after the agent is gone, pods reach the node\'s service again');
  });

  it('keeps the rule at exit with BROKER_IPTABLES_REMOVE_ON_EXIT=false', async () => {
    const agent = startAgent({ BROKER_IPTABLES_REMOVE_ON_EXIT: 'false' });
    await agent.waitForLog('the rule to be installed', agent.event('node.iptables', 'installed'));
    assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
    const rules = await brokerNatRules();
    assert.deepEqual([rules.jumps.length, rules.dnats.length], [1, 1]);
    const refused = await pod.exec(['curl', '-sS', '--max-time', '5', CREDENTIALS_URL]);
    assert.notEqual(refused.code, 0, 'pods get connection refused, never the node\'s role, while the agent is away');
  });

  it('re-installs the rule after an external flush; a client already on the agent keeps its connection throughout', async () => {
    const agent = startAgent({ BROKER_IPTABLES_CHECK_INTERVAL: '1s' });
    await agent.waitForLog('the rule to be in place', (line) => line.event === 'node.iptables');
    const client = KeepAliveClient.start(pod, CREDENTIALS_URL);
    try {
      await client.waitForAnswers('the client to reach the agent through the rule', (answers) => answers.filter(fromAgent).length >= 3);
      const flushedAt = Date.now();
      await sh('iptables', '-t', 'nat', '-F', 'PREROUTING');
      await sh('iptables', '-t', 'nat', '-F', 'KUBE-IAM-BROKER');
      const reinstalled = await agent.waitForLog('the rule to be re-installed', agent.event('node.iptables', 'reinstalled'));
      const redropped = await agent.waitForLog('the drop after the re-install', (line) => line.event === 'node.conntrack' && Date.parse(line.time) >= Date.parse(reinstalled.time));
      console.log(`external flush: rule re-installed ${Date.parse(reinstalled.time) - flushedAt} ms later (check interval 1 s); ${redropped.count} connection(s) dropped after it`);
      assert.ok(agent.logs.some((line) => line.level === 40 && /re-installed/.test(line.msg)), 'a warning tells the operator');
      const rules = await brokerNatRules();
      assert.deepEqual([rules.jumps.length, rules.dnats.length], [1, 1]);
      const droppedAt = Date.parse(redropped.time);
      await client.waitForAnswers('answers after the drop', (answers) => answers.filter((answer) => answer.at > droppedAt).length >= 5);
      const answers = [...client.answers];
      assert.ok(answers.every(fromAgent), `the client stayed on the agent throughout: ${JSON.stringify(answers.filter((answer) => !fromAgent(answer)))}`);
      assert.equal(new Set(answers.map((answer) => answer.localPort)).size, 1, 'over the one keep-alive connection it had before the flush');
      const response = await pod.exec(['curl', '-sS', '--max-time', '5', CREDENTIALS_URL]);
      assert.equal(response.stdout, 'app-role', 'a new connection goes through the re-installed rule');
    } finally {
      await client.stop();
    }
    assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
  });

  it('with BROKER_IPTABLES_BINARY=auto, writes to the legacy backend where kubelet left its hint chain, and the rule works there', async () => {
    await sh('iptables-legacy', '-w', '5', '-t', 'mangle', '-N', 'KUBE-IPTABLES-HINT');
    try {
      const agent = startAgent();
      const installed = await agent.waitForLog('the rule to be installed', agent.event('node.iptables', 'installed'));
      assert.match(String(installed.detail), /^iptables-legacy /);
      const [legacy, nft] = await Promise.all([brokerNatRules('iptables-legacy'), brokerNatRules('iptables')]);
      assert.deepEqual([legacy.jumps.length, legacy.dnats.length, nft.jumps.length, nft.dnats.length], [1, 1, 0, 0]);
      const response = await pod.exec(['curl', '-sS', '--max-time', '5', CREDENTIALS_URL]);
      assert.equal(response.stdout, 'app-role');
      assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
      assert.deepEqual(await brokerNatRules('iptables-legacy'), { jumps: [], dnats: [] });
    } finally {
      await sh('iptables-legacy', '-w', '5', '-t', 'mangle', '-X', 'KUBE-IPTABLES-HINT');
    }
  });

  it('fails to start with an error naming NET_ADMIN when iptables is refused, and installs nothing', async () => {
    const withoutNetAdmin = join(workDir, 'iptables-without-net-admin');
    await writeFile(withoutNetAdmin, '#!/bin/sh\nexec setpriv --bounding-set=-net_admin --inh-caps=-net_admin iptables "$@"\n', { mode: 0o755 });
    const agent = startAgent({ BROKER_IPTABLES_BINARY: withoutNetAdmin });
    assert.deepEqual(await withTimeout(agent.exited, 90_000), { code: 2, signal: null });
    assert.ok(agent.logs.some((line) => /needs the NET_ADMIN capability/.test(line.msg)), agent.logs.map((line) => line.msg).join('\n'));
    assert.deepEqual(await brokerNatRules(), { jumps: [], dnats: [] });
  });

  it('removes the readiness taint from its own node through the API once the rule is in place and the informers synced', async () => {
    api.upsertNode({ metadata: { name: NODE }, spec: { taints: [OTHER_TAINT, READINESS_TAINT] } });
    api.upsertNode({ metadata: { name: 'node-b' }, spec: { taints: [READINESS_TAINT] } });
    const agent = startAgent({ BROKER_NODE_TAINT: `${READINESS_TAINT.key}:${READINESS_TAINT.effect}` });
    await eventually('the taint to be removed', () => (api.getNode(NODE)?.spec?.taints?.length === 1 ? true : undefined), 90_000);
    assert.deepEqual(api.getNode(NODE)?.spec?.taints, [OTHER_TAINT], 'only the readiness taint went');
    assert.deepEqual(api.getNode('node-b')?.spec?.taints, [READINESS_TAINT], 'another node is never touched');
    const patches = api.requests.filter((request) => request.method === 'PATCH');
    assert.deepEqual(patches.map((request) => request.path), [`/api/v1/nodes/${NODE}`]);
    assert.ok((patches[0]?.body as Array<{ op: string }>).some((op) => op.op === 'test'), 'the JSON patch tests the taint it removes');
    const removed = await agent.waitForLog('the removal to be logged', (line) => /removed the readiness taint/.test(line.msg));
    const installed = agent.logs.find((line) => line.event === 'node.iptables');
    assert.ok(installed && agent.logs.indexOf(installed) < agent.logs.indexOf(removed), 'the taint goes only after the rule is in place');
    assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
  });
});
