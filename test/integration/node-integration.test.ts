/**
 * The agent on a node: its DNAT rule and guards (installed, idempotent across restarts and
 * crashes, kept in place while no agent runs, removed by node-cleanup), the keep-alive connections
 * that predate them, IPv6 metadata, and the readiness taint. The agent runs as a child process,
 * pods are dual-stack network namespaces on a bridge, and the node's metadata service is a
 * stand-in on 169.254.169.254:80 and [fd00:ec2::254]:80 in the test's own namespace.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import { FakeKubeApi } from '../../src/sandbox/kube-api/server.js';
import { NODE } from '../fixtures/agent.js';
import { type NetnsPod, PodNetwork, requireHermetic } from '../fixtures/netns.js';
import {
  ChildAgent,
  type ClientAnswer,
  KeepAliveClient,
  METADATA_ADDRESS,
  NO_RULES,
  NodeMetadataService,
  brokerRules,
  brokerTraces,
  nodeAgentEnv,
  removeBrokerRules,
  sh,
  trackConnectionsLikeANode,
  withTimeout,
} from '../fixtures/node.js';
import { IPV6_METADATA_ADDRESS } from '../../src/node/ipv6.js';
import { eventually } from '../../testkit/eventually.js';

const CREDENTIALS_URL = `http://${METADATA_ADDRESS}/latest/meta-data/iam/security-credentials/`;
const IPV6_CREDENTIALS_URL = `http://[${IPV6_METADATA_ADDRESS}]/latest/meta-data/iam/security-credentials/`;
const READINESS_TAINT = { key: 'kube-iam-broker/not-ready', effect: 'NoSchedule' };
const OTHER_TAINT = { key: 'example.com/maintenance', value: 'soon', effect: 'PreferNoSchedule' };
const fromAgent = (answer: ClientAnswer) => answer.body === 'app-role';
const fromNode = (answer: ClientAnswer) => answer.body === 'node-role';

describe('node integration: the DNAT rule, stale connections and the readiness taint', () => {
  let api: FakeKubeApi;
  let network: PodNetwork;
  let metadata: NodeMetadataService;
  let ipv6Metadata: NodeMetadataService;
  let pod: NetnsPod;
  let workDir: string;
  let stopTracking: () => Promise<void>;
  const agents: ChildAgent[] = [];

  const startAgent = (env: Record<string, string> = {}) => {
    const agent = ChildAgent.start({ ...nodeAgentEnv(api.writeKubeconfig(workDir), network, 8181), ...env });
    agents.push(agent);
    return agent;
  };

  before(async () => {
    requireHermetic();
    stopTracking = await trackConnectionsLikeANode();
    [api, network, metadata, ipv6Metadata, workDir] = await Promise.all([
      FakeKubeApi.start(),
      PodNetwork.create({ ipv6: true }),
      NodeMetadataService.start(),
      NodeMetadataService.start(IPV6_METADATA_ADDRESS),
      mkdtemp(join(tmpdir(), 'kib-node-')),
    ]);
    pod = await network.addPod('app');
    api.upsertNamespace({ metadata: { name: 'default' } });
    api.upsertPod({
      metadata: { name: 'app', namespace: 'default', annotations: { 'iam.amazonaws.com/role': 'app-role' } },
      spec: { nodeName: NODE, serviceAccountName: 'app' },
      status: { phase: 'Running', podIP: pod.ip, podIPs: [{ ip: pod.ip }, { ip: pod.ipv6 as string }] },
    });
  });

  // An agent or the rules it leaves behind would hold the port and the rules for the next test.
  afterEach(async () => {
    for (const agent of agents.splice(0)) await agent.kill();
    await removeBrokerRules();
  });

  after(async () => {
    await Promise.all([
      api?.stop(),
      metadata?.stop(),
      ipv6Metadata?.stop(),
      network?.destroy(),
      workDir && rm(workDir, { recursive: true, force: true }),
    ]);
    await stopTracking?.();
  });

  it('moves a keep-alive client that predates the agent onto the agent, without restarting the client', async () => {
    const client = KeepAliveClient.start(pod, CREDENTIALS_URL);
    try {
      await client.waitForAnswers(
        "the client to talk to the node's metadata service",
        (answers) => answers.filter(fromNode).length >= 5,
      );
      const { stdout: tracked } = await sh('conntrack', '-L', '-p', 'tcp', '--orig-dst', METADATA_ADDRESS);
      assert.match(
        tracked,
        new RegExp(`ESTABLISHED src=${pod.ip.replace(/\./g, '\\.')} dst=${METADATA_ADDRESS}`),
        "the client's connection is tracked to the old destination",
      );

      const agent = startAgent();
      const dropped = await agent.waitForLog(
        'the stale connections to be dropped',
        agent.event('node.conntrack', 'dropped'),
      );
      assert.ok((dropped.count ?? 0) >= 1, `dropped ${dropped.count} entries`);
      await client.waitForAnswers('the client to reach the agent', (answers) => answers.filter(fromAgent).length >= 5);

      const answers = [...client.answers];
      const firstFromAgent = answers.findIndex(fromAgent);
      const before = answers.slice(0, firstFromAgent);
      const since = answers.slice(firstFromAgent);
      assert.equal(
        new Set(before.filter(fromNode).map((answer) => answer.localPort)).size,
        1,
        'before the agent: one keep-alive connection, reused',
      );
      assert.ok(
        since.every(fromAgent),
        `once on the agent, every answer comes from it: ${JSON.stringify(since.filter((answer) => !fromAgent(answer)))}`,
      );
      const failedBetween = before.filter((answer) => answer.error !== undefined);
      assert.ok(
        failedBetween.length <= 1,
        `at most the one request on the reset connection fails: ${JSON.stringify(failedBetween)}`,
      );
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

  it("without dropping connections (BROKER_DROP_CONNECTIONS=false), the guard still takes a client that predates the agent off the node's service", async () => {
    const client = KeepAliveClient.start(pod, CREDENTIALS_URL);
    try {
      await client.waitForAnswers(
        "the client to talk to the node's metadata service",
        (answers) => answers.filter(fromNode).length >= 3,
      );
      const agent = startAgent({ BROKER_DROP_CONNECTIONS: 'false' });
      const installed = await agent.waitForLog('the rules to be installed', agent.event('node.iptables', 'installed'));
      const installedAt = Date.parse(installed.time);
      await client.waitForAnswers(
        'answers from the agent after the rules were installed',
        (answers) => answers.filter((answer) => answer.at > installedAt && fromAgent(answer)).length >= 5,
      );
      const afterRules = client.answers.filter((answer) => answer.at > installedAt);
      assert.ok(
        !afterRules.some(fromNode),
        `no answer from the node's service once the guard is in place: ${JSON.stringify(afterRules.filter(fromNode))}`,
      );
      const failed = client.answers.filter((answer) => answer.error !== undefined);
      console.log(
        `stale keep-alive connection without conntrack drop: ${failed.length} request(s) failed (${failed.map((answer) => answer.error).join(', ')}) between the node's service and the agent`,
      );
      assert.ok(!agent.logs.some(agent.event('node.conntrack')), 'nothing was dropped');
      assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
    } finally {
      await client.stop();
    }
  });

  it('installs the rules once across two starts and a kill -9, rewrites the redirect for a new port, and removes them on SIGTERM with BROKER_IPTABLES_REMOVE_ON_EXIT=true', async () => {
    const first = startAgent();
    await first.waitForLog('the rule to be installed', first.event('node.iptables', 'installed'));
    assert.deepEqual(await first.signal('SIGKILL'), { code: null, signal: 'SIGKILL' });
    let rules = await brokerRules();
    assert.equal(rules.jumps.length, 1, 'a crash leaves the rule behind');

    const second = startAgent();
    await second.waitForLog('the rule to be found in place', second.event('node.iptables', 'in-place'));
    rules = await brokerRules();
    assert.deepEqual(
      [rules.jumps.length, rules.dnats.length, rules.guardJumps.length, rules.guards.length],
      [1, 1, 2, 1],
      `one jump and one DNAT, a guard jumped to from INPUT and FORWARD: ${JSON.stringify(rules)}`,
    );
    assert.match(
      rules.dnats[0] as string,
      new RegExp(`-i ${network.bridge} .*--dport 80 .*--to-destination ${network.nodeIp.replace(/\./g, '\\.')}:8181`),
    );
    assert.deepEqual(await second.signal('SIGKILL'), { code: null, signal: 'SIGKILL' });

    const moved = startAgent({ BROKER_LISTEN: `${network.nodeIp}:8282`, BROKER_IPTABLES_REMOVE_ON_EXIT: 'true' });
    await moved.waitForLog('the rule to be rewritten', moved.event('node.iptables', 'installed'));
    rules = await brokerRules();
    assert.deepEqual(
      [rules.jumps.length, rules.dnats.length, rules.guardJumps.length, rules.guards.length],
      [1, 1, 2, 1],
      `still one of each: ${JSON.stringify(rules)}`,
    );
    assert.match(rules.dnats[0] as string, /--to-destination [\d.]+:8282$/);
    const response = await pod.exec(['curl', '-sS', '--max-time', '5', CREDENTIALS_URL]);
    assert.equal(response.stdout, 'app-role', 'a new connection from the pod reaches the agent on its new port');

    assert.deepEqual(await moved.signal('SIGTERM'), { code: 0, signal: null });
    assert.deepEqual(await brokerRules(), NO_RULES, 'removed on exit');
    assert.deepEqual(await brokerRules('ip6tables'), NO_RULES, 'the IPv6 guard too');
    assert.ok(moved.logs.some(moved.event('node.iptables', 'removed')));
    const afterExit = await pod.exec(['curl', '-sS', '--max-time', '5', CREDENTIALS_URL]);
    assert.equal(afterExit.stdout, 'node-role', "after the agent is gone, pods reach the node's service again");
  });

  it("fails closed while no agent runs: keep-alive and new connections during a stop and restart never reach the node's service; the next agent takes over with one rule; node-cleanup leaves nothing", async () => {
    const first = startAgent();
    await first.waitForLog('the rules to be installed', first.event('node.iptables', 'installed'));
    const clients = {
      keepAlive: KeepAliveClient.start(pod, CREDENTIALS_URL),
      newConnections: KeepAliveClient.start(pod, CREDENTIALS_URL, 180_000, 'new-connections'),
      ipv6: KeepAliveClient.start(pod, IPV6_CREDENTIALS_URL, 180_000, 'new-connections'),
    };
    // The agent itself asks the node's IPv4 service (its region, for STS); nobody may ask the IPv6 one.
    const ipv6RequestsBefore = ipv6Metadata.requests;
    try {
      await clients.keepAlive.waitForAnswers(
        'the keep-alive client on the agent',
        (answers) => answers.filter(fromAgent).length >= 3,
      );
      await clients.newConnections.waitForAnswers(
        'the new-connection client on the agent',
        (answers) => answers.filter(fromAgent).length >= 3,
      );
      assert.deepEqual(await first.signal('SIGTERM'), { code: 0, signal: null });
      const stoppedAt = Date.now();
      assert.ok(
        first.logs.some((line) => /left the rules in place/.test(line.msg)),
        'the agent says it left its rules',
      );
      const gap = (client: KeepAliveClient) => client.answers.filter((answer) => answer.at > stoppedAt);
      await clients.keepAlive.waitForAnswers(
        'refusals while no agent runs',
        (answers) => answers.filter((answer) => answer.at > stoppedAt && answer.error).length >= 5,
      );
      await clients.newConnections.waitForAnswers(
        'refusals while no agent runs',
        (answers) => answers.filter((answer) => answer.at > stoppedAt && answer.error).length >= 5,
      );

      const second = startAgent();
      await second.waitForLog('the rules to be found in place', second.event('node.iptables', 'in-place'));
      const restartedAt = Date.now();
      for (const client of [clients.keepAlive, clients.newConnections]) {
        await client.waitForAnswers(
          'answers from the next agent',
          (answers) => answers.filter((answer) => answer.at > restartedAt && fromAgent(answer)).length >= 3,
        );
      }
      const rules = await brokerRules();
      assert.deepEqual(
        [rules.jumps.length, rules.dnats.length, rules.guardJumps.length, rules.guards.length],
        [1, 1, 2, 1],
        `one of each, not two: ${JSON.stringify(rules)}`,
      );
      const ipv6Rules = await brokerRules('ip6tables');
      assert.deepEqual(
        [ipv6Rules.guardJumps.length, ipv6Rules.guards.length],
        [2, 1],
        `one IPv6 guard: ${JSON.stringify(ipv6Rules)}`,
      );

      const errors = (client: KeepAliveClient) =>
        [
          ...new Set(
            gap(client)
              .filter((answer) => answer.error)
              .map((answer) => answer.error),
          ),
        ].join(', ');
      console.log(
        `agent away ${restartedAt - stoppedAt} ms: keep-alive client ${gap(clients.keepAlive).filter((answer) => answer.error).length} refused (${errors(clients.keepAlive)}), ` +
          `new connections ${gap(clients.newConnections).filter((answer) => answer.error).length} refused (${errors(clients.newConnections)}), IPv6 ${clients.ipv6.answers.length} refused (${errors(clients.ipv6)})`,
      );
      for (const [name, client] of Object.entries(clients)) {
        assert.ok(
          !client.answers.some(fromNode),
          `${name}: never an answer from the node's service: ${JSON.stringify(client.answers.filter(fromNode))}`,
        );
      }
      assert.ok(
        clients.ipv6.answers.length >= 5 && clients.ipv6.answers.every((answer) => answer.error === 'ECONNREFUSED'),
        'IPv6 metadata is refused throughout',
      );
      assert.equal(ipv6Metadata.requests, ipv6RequestsBefore, "the node's IPv6 service saw no request");
      assert.deepEqual(await second.signal('SIGTERM'), { code: 0, signal: null });
    } finally {
      await Promise.all(Object.values(clients).map((client) => client.stop()));
    }

    const cleanupLog = await removeBrokerRules();
    assert.equal(
      cleanupLog.match(/"outcome":"removed"/g)?.length,
      3,
      `node-cleanup removed the redirect and both guards:\n${cleanupLog}`,
    );
    assert.deepEqual(await brokerTraces(), [], 'nothing of the broker is left in any backend or address family');
    const afterCleanup = await pod.exec(['curl', '-sS', '--max-time', '5', CREDENTIALS_URL]);
    assert.equal(
      afterCleanup.stdout,
      'node-role',
      "after node-cleanup, pods reach the node's service again (so the refusals above were the agent's doing)",
    );
    const ipv6AfterCleanup = await pod.exec(['curl', '-sS', '--max-time', '5', IPV6_CREDENTIALS_URL]);
    assert.equal(ipv6AfterCleanup.stdout, 'node-role', 'and its IPv6 endpoint');
  });

  it("IPv6: a pod that reaches the node's role on fd00:ec2::254 without the agent is refused there once it runs, and keeps getting its own role over IPv4", async () => {
    const before = await pod.exec(['curl', '-sS', '--max-time', '5', IPV6_CREDENTIALS_URL]);
    assert.equal(before.stdout, 'node-role', "without the agent, IPv6 metadata hands the pod the node's role");
    const agent = startAgent();
    const installed = await agent.waitForLog('the rules to be installed', agent.event('node.iptables', 'installed'));
    assert.match(
      String(installed.detail),
      /ip6tables(-\w+)? -t filter -A KUBE-IAM-BROKER-GUARD -d fd00:ec2::254\/128 /,
    );
    const requestsBefore = ipv6Metadata.requests;
    const refused = await pod.exec(['curl', '-sS', '--max-time', '5', IPV6_CREDENTIALS_URL]);
    assert.equal(refused.code, 7, `curl cannot connect (connection refused): ${refused.stderr}`);
    assert.equal(ipv6Metadata.requests, requestsBefore, "the node's IPv6 service saw nothing");
    const ipv4 = await pod.exec(['curl', '-sS', '--max-time', '5', CREDENTIALS_URL]);
    assert.equal(ipv4.stdout, 'app-role');
    assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
    const stillRefused = await pod.exec(['curl', '-sS', '--max-time', '5', IPV6_CREDENTIALS_URL]);
    assert.equal(stillRefused.code, 7, 'and while no agent runs');
  });

  it('re-installs the rule after an external flush; a client already on the agent keeps its connection throughout', async () => {
    const agent = startAgent({ BROKER_IPTABLES_CHECK_INTERVAL: '1s' });
    await agent.waitForLog('the rule to be in place', (line) => line.event === 'node.iptables');
    const client = KeepAliveClient.start(pod, CREDENTIALS_URL);
    try {
      await client.waitForAnswers(
        'the client to reach the agent through the rule',
        (answers) => answers.filter(fromAgent).length >= 3,
      );
      const flushedAt = Date.now();
      await sh('iptables', '-t', 'nat', '-F', 'PREROUTING');
      await sh('iptables', '-t', 'nat', '-F', 'KUBE-IAM-BROKER');
      const reinstalled = await agent.waitForLog(
        'the rule to be re-installed',
        agent.event('node.iptables', 'reinstalled'),
      );
      const redropped = await agent.waitForLog(
        'the drop after the re-install',
        (line) => line.event === 'node.conntrack' && Date.parse(line.time) >= Date.parse(reinstalled.time),
      );
      console.log(
        `external flush: rule re-installed ${Date.parse(reinstalled.time) - flushedAt} ms later (check interval 1 s); ${redropped.count} connection(s) dropped after it`,
      );
      assert.ok(
        agent.logs.some((line) => line.level === 40 && /re-installed/.test(line.msg)),
        'a warning tells the operator',
      );
      const rules = await brokerRules();
      assert.deepEqual([rules.jumps.length, rules.dnats.length], [1, 1]);
      const droppedAt = Date.parse(redropped.time);
      await client.waitForAnswers(
        'answers after the drop',
        (answers) => answers.filter((answer) => answer.at > droppedAt).length >= 5,
      );
      const answers = [...client.answers];
      assert.ok(
        answers.every(fromAgent),
        `the client stayed on the agent throughout: ${JSON.stringify(answers.filter((answer) => !fromAgent(answer)))}`,
      );
      assert.equal(
        new Set(answers.map((answer) => answer.localPort)).size,
        1,
        'over the one keep-alive connection it had before the flush',
      );
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
      const [legacy, nft, legacyIpv6, nftIpv6] = await Promise.all([
        brokerRules('iptables-legacy'),
        brokerRules('iptables'),
        brokerRules('ip6tables-legacy'),
        brokerRules('ip6tables'),
      ]);
      assert.deepEqual(
        [legacy.jumps.length, legacy.dnats.length, legacy.guards.length, legacyIpv6.guards.length],
        [1, 1, 1, 1],
        'redirect and guards in the legacy backend',
      );
      assert.deepEqual([nft, nftIpv6], [NO_RULES, NO_RULES], 'nothing in nf_tables');
      const response = await pod.exec(['curl', '-sS', '--max-time', '5', CREDENTIALS_URL]);
      assert.equal(response.stdout, 'app-role');
      assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
      await removeBrokerRules();
      assert.deepEqual(await brokerTraces(), [], 'node-cleanup finds them in the legacy backend');
    } finally {
      await sh('iptables-legacy', '-w', '5', '-t', 'mangle', '-X', 'KUBE-IPTABLES-HINT');
    }
  });

  it('fails to start with an error naming NET_ADMIN when iptables is refused, and installs nothing', async () => {
    const withoutNetAdmin = join(workDir, 'iptables-without-net-admin');
    await writeFile(
      withoutNetAdmin,
      '#!/bin/sh\nexec setpriv --bounding-set=-net_admin --inh-caps=-net_admin iptables "$@"\n',
      { mode: 0o755 },
    );
    const agent = startAgent({ BROKER_IPTABLES_BINARY: withoutNetAdmin });
    assert.deepEqual(await withTimeout(agent.exited, 90_000), { code: 2, signal: null });
    assert.ok(
      agent.logs.some((line) => /needs the NET_ADMIN capability/.test(line.msg)),
      agent.logs.map((line) => line.msg).join('\n'),
    );
    assert.deepEqual(await brokerRules(), NO_RULES);
  });

  it('removes the readiness taint from its own node through the API once the rule is in place and the informers synced', async () => {
    api.upsertNode({ metadata: { name: NODE }, spec: { taints: [OTHER_TAINT, READINESS_TAINT] } });
    api.upsertNode({ metadata: { name: 'node-b' }, spec: { taints: [READINESS_TAINT] } });
    const agent = startAgent({ BROKER_NODE_TAINT: `${READINESS_TAINT.key}:${READINESS_TAINT.effect}` });
    await eventually(
      'the taint to be removed',
      () => (api.getNode(NODE)?.spec?.taints?.length === 1 ? true : undefined),
      90_000,
    );
    assert.deepEqual(api.getNode(NODE)?.spec?.taints, [OTHER_TAINT], 'only the readiness taint went');
    assert.deepEqual(api.getNode('node-b')?.spec?.taints, [READINESS_TAINT], 'another node is never touched');
    const patches = api.requests.filter((request) => request.method === 'PATCH');
    assert.deepEqual(
      patches.map((request) => request.path),
      [`/api/v1/nodes/${NODE}`],
    );
    assert.ok(
      (patches[0]?.body as Array<{ op: string }>).some((op) => op.op === 'test'),
      'the JSON patch tests the taint it removes',
    );
    const removed = await agent.waitForLog('the removal to be logged', (line) =>
      /removed the readiness taint/.test(line.msg),
    );
    const installed = agent.logs.find((line) => line.event === 'node.iptables');
    assert.ok(
      installed && agent.logs.indexOf(installed) < agent.logs.indexOf(removed),
      'the taint goes only after the rule is in place',
    );
    assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
  });
});
