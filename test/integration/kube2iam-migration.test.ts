/**
 * The README's migration runbook from kube2iam, end to end with the real kube2iam 0.15 (built from
 * ../shared/peers/kube2iam; KUBE2IAM_BINARY names a prebuilt one): kube2iam runs on a network-namespace
 * node with its --iptables rule, against the fake API server and moto, while two pods keep fetching
 * their credentials through 169.254.169.254. Then the runbook's steps: the agent starts on another
 * port and puts its jump ahead of kube2iam's rule, kube2iam's DaemonSet goes, kube2iam's leftover
 * rule is deleted, the agent moves to 8181. No request may get the node's role or another pod's
 * role; afterwards the only redirect of the metadata address is the agent's.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { GetCallerIdentityCommand, STSClient } from '@aws-sdk/client-sts';
import { FakeKubeApi } from '../../src/sandbox/kube-api/server.js';
import { BASE_ROLE_ARN, NODE } from '../fixtures/agent.js';
import { type NetnsPod, PodNetwork, requireHermetic } from '../fixtures/netns.js';
import {
  ChildAgent,
  type ClientAnswer,
  KeepAliveClient,
  METADATA_ADDRESS,
  NodeMetadataService,
  nodeAgentEnv,
  removeBrokerRules,
  sh,
  trackConnectionsLikeANode,
  withTimeout,
} from '../fixtures/node.js';
import { kube2iamBinary } from '../../testkit/kube2iam.js';
import { Moto, motoEnv } from '../../testkit/moto.js';

const KUBE2IAM_PORT = 8181;
/** The agent's port while kube2iam still holds 8181 on the node (k8s/components/kube2iam-migration). */
const MIGRATION_PORT = 8183;
const PODS = [
  { name: 'app', role: 'app-role' },
  { name: 'other', role: 'other-role' },
] as const;
/** Each pod's requests, over a keep-alive connection and over a new connection each time (a fresh process). */
const CONNECTIONS = ['keep-alive', 'new-connections'] as const;

interface PodClients {
  readonly role: string;
  readonly clients: Record<(typeof CONNECTIONS)[number], KeepAliveClient>;
}

const credentialsOf = (
  answer: ClientAnswer,
): { AccessKeyId: string; SecretAccessKey: string; Token: string } | undefined => {
  try {
    const parsed = JSON.parse(answer.body ?? '') as { AccessKeyId?: unknown };
    return typeof parsed.AccessKeyId === 'string'
      ? (parsed as { AccessKeyId: string; SecretAccessKey: string; Token: string })
      : undefined;
  } catch {
    return undefined;
  }
};

/** Every DNAT of the metadata address in the nat table, in any chain (`iptables -t nat -S`, as the runbook checks). */
async function metadataRedirects(): Promise<string[]> {
  const nat = await sh('iptables', '-w', '5', '-t', 'nat', '-S');
  return nat.stdout.split('\n').filter((line) => line.includes(`-d ${METADATA_ADDRESS}/32`) && /-j DNAT/.test(line));
}

/** kube2iam as its DaemonSet runs it: --iptables with the node's IP and the pods' interface. */
class Kube2iam {
  private output = '';
  private readonly exited: Promise<unknown>;
  private constructor(private readonly child: ChildProcess) {
    for (const stream of [child.stdout, child.stderr])
      stream?.setEncoding('utf8').on('data', (chunk: string) => (this.output = (this.output + chunk).slice(-8_000)));
    this.exited = once(child, 'exit');
  }

  static start(binary: string, args: readonly string[], env: Record<string, string>): Kube2iam {
    return new Kube2iam(
      spawn(binary, args, {
        env: { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin', ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
      }),
    );
  }

  get log(): string {
    return this.output;
  }

  /** `kubectl delete daemonset kube2iam`: SIGTERM, then SIGKILL after the grace period. */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.kill('SIGTERM');
    await withTimeout(this.exited, 10_000, 'kube2iam to exit').catch(async () => {
      this.child.kill('SIGKILL');
      await this.exited;
    });
  }
}

describe('migration from kube2iam 0.15 (the README runbook)', () => {
  const kube2iam = kube2iamBinary();
  let api: FakeKubeApi;
  let moto: Moto;
  let network: PodNetwork;
  let metadata: NodeMetadataService;
  let workDir: string;
  let stopTracking: () => Promise<void>;
  const pods = new Map<string, NetnsPod>();

  before(async () => {
    if ('skipped' in kube2iam) return;
    requireHermetic();
    stopTracking = await trackConnectionsLikeANode();
    network = await PodNetwork.create();
    [api, moto, metadata, workDir] = await Promise.all([
      FakeKubeApi.start(),
      Moto.start(network.nodeIp),
      NodeMetadataService.start(),
      mkdtemp(join(tmpdir(), 'kib-migration-')),
    ]);
    api.upsertNamespace({ metadata: { name: 'default' } });
    for (const { name, role } of PODS) {
      const pod = await network.addPod(name);
      pods.set(name, pod);
      api.upsertPod({
        metadata: { name, namespace: 'default', annotations: { 'iam.amazonaws.com/role': role } },
        spec: { nodeName: NODE, serviceAccountName: name },
        status: { phase: 'Running', podIP: pod.ip, podIPs: [{ ip: pod.ip }] },
      });
    }
  });

  after(async () => {
    if ('skipped' in kube2iam) return;
    await removeBrokerRules();
    for (const redirect of await metadataRedirects())
      await sh('iptables', '-w', '5', '-t', 'nat', ...redirect.replace(/^-A /, '-D ').split(' '));
    await Promise.all([api?.stop(), moto?.stop(), metadata?.stop(), network?.destroy()]);
    await stopTracking?.();
    if (workDir) await rm(workDir, { recursive: true, force: true });
  });

  it("switches the node from kube2iam to the agent: never the node's role or another pod's, and one redirect left, the agent's", async (t) => {
    if ('skipped' in kube2iam) return t.skip(kube2iam.skipped);
    const kubeconfig = api.writeKubeconfig(workDir);
    const aws = motoEnv(moto.endpoint);

    // Before: kube2iam's DaemonSet, with its rule appended to PREROUTING.
    const old = Kube2iam.start(
      kube2iam.binary,
      [
        '--kubeconfig',
        kubeconfig,
        '--node',
        NODE,
        '--base-role-arn',
        BASE_ROLE_ARN,
        '--iptables=true',
        '--host-ip',
        network.nodeIp,
        '--host-interface',
        network.bridge,
        '--app-port',
        String(KUBE2IAM_PORT),
      ],
      { ...aws, AWS_EC2_METADATA_SERVICE_ENDPOINT: `http://${METADATA_ADDRESS}` },
    );
    const agents: ChildAgent[] = [];
    const running: PodClients[] = PODS.map(({ name, role }) => ({
      role,
      clients: Object.fromEntries(
        CONNECTIONS.map((connections) => [
          connections,
          KeepAliveClient.start(
            pods.get(name) as NetnsPod,
            `http://${METADATA_ADDRESS}/latest/meta-data/iam/security-credentials/${role}`,
            120_000,
            connections,
          ),
        ]),
      ) as PodClients['clients'],
    }));
    const everyClient = running.flatMap(({ clients }) => Object.values(clients));
    const credentialsSince = (at: number, count: number) => (answers: readonly ClientAnswer[]) =>
      answers.filter((answer) => answer.at > at && credentialsOf(answer)).length >= count;
    try {
      const kube2iamRule = await withTimeout(
        (async () => {
          for (;;) {
            const [rule] = await metadataRedirects();
            if (rule) return rule;
            await new Promise((resolve) => setTimeout(resolve, 100));
          }
        })(),
        30_000,
        `kube2iam's rule; its log:\n${old.log}`,
      );
      assert.match(
        kube2iamRule,
        new RegExp(`^-A PREROUTING .*-j DNAT --to-destination ${network.nodeIp}:${KUBE2IAM_PORT}$`),
      );
      for (const client of everyClient)
        await client.waitForAnswers('credentials from kube2iam', credentialsSince(0, 3), 30_000);

      // Step 2: the agent on another port; its jump goes first in PREROUTING, ahead of kube2iam's rule.
      const startAgent = (port: number) => {
        const started = ChildAgent.start({ ...aws, ...nodeAgentEnv(kubeconfig, network, port) });
        agents.push(started);
        return started;
      };
      const agent = startAgent(MIGRATION_PORT);
      const installed = await agent.waitForLog("the agent's rules", agent.event('node.iptables', 'installed'));
      const takenOverAt = Date.parse(installed.time);
      const prerouting = (await sh('iptables', '-w', '5', '-t', 'nat', '-S', 'PREROUTING')).stdout
        .split('\n')
        .filter((line) => line.startsWith('-A '));
      assert.match(
        prerouting[0] as string,
        /-j KUBE-IAM-BROKER$/,
        `the agent's jump is first, ahead of kube2iam's rule: ${prerouting.join(' | ')}`,
      );
      await running[0]?.clients['new-connections'].waitForAnswers(
        'new connections served by the agent',
        credentialsSince(takenOverAt, 3),
      );
      await agent.waitForLog('the agent to serve a pod', agent.event('credential.issued'));

      // Step 3: kube2iam's DaemonSet deleted; its rule stays (kube2iam 0.15 never removes it), shadowed by the agent's jump.
      await old.stop();
      const kube2iamGoneAt = Date.now();
      const leftBehind = await metadataRedirects();
      assert.ok(
        leftBehind.length === 2 && leftBehind.includes(kube2iamRule),
        `kube2iam left its rule behind, beside the agent's: ${leftBehind.join(' | ')}`,
      );
      // Step 4: the runbook's command for kube2iam's leftover rule.
      const deleted = await sh(
        'iptables',
        '-w',
        '5',
        '-t',
        'nat',
        '-D',
        'PREROUTING',
        '-p',
        'tcp',
        '-d',
        METADATA_ADDRESS,
        '--dport',
        '80',
        '-j',
        'DNAT',
        '--to-destination',
        `${network.nodeIp}:${KUBE2IAM_PORT}`,
        '-i',
        network.bridge,
      );
      assert.equal(deleted.code, 0, deleted.stderr);
      for (const client of everyClient)
        await client.waitForAnswers(
          'credentials from the agent after kube2iam left',
          credentialsSince(kube2iamGoneAt, 5),
          30_000,
        );

      // Step 5: the agent back on 8181 (the DaemonSet without the migration component: a rolling update).
      const moveStartsAt = Date.now();
      assert.deepEqual(await agent.signal('SIGTERM'), { code: 0, signal: null });
      const moved = startAgent(KUBE2IAM_PORT);
      const rewritten = await moved.waitForLog(
        'the redirect rewritten for 8181',
        moved.event('node.iptables', 'installed'),
      );
      for (const client of everyClient)
        await client.waitForAnswers(
          'credentials from the agent on 8181',
          credentialsSince(Date.parse(rewritten.time), 5),
          30_000,
        );

      const redirects = await metadataRedirects();
      assert.equal(redirects.length, 1, `exactly one redirect of the metadata address: ${redirects.join(' | ')}`);
      assert.match(
        redirects[0] as string,
        new RegExp(`^-A KUBE-IAM-BROKER .*--to-destination ${network.nodeIp}:${KUBE2IAM_PORT}$`),
        "and it is the agent's",
      );

      // What every pod got during the switch.
      await Promise.all(everyClient.map((client) => client.stop()));
      const summary: string[] = [];
      for (const { role, clients } of running) {
        for (const [connections, client] of Object.entries(clients)) {
          const answers = [...client.answers];
          assert.ok(
            !answers.some((answer) => answer.body === 'node-role'),
            `${role} (${connections}): never the node's role`,
          );
          const issued = answers.map(credentialsOf).filter((credentials) => credentials !== undefined);
          const refused = answers.filter((answer) => answer.error !== undefined);
          const refusedInSwitch = refused.filter((answer) => answer.at < moveStartsAt).length;
          const otherBodies = answers.filter((answer) => answer.error === undefined && !credentialsOf(answer));
          for (const accessKeyId of new Set(issued.map((credentials) => credentials.AccessKeyId))) {
            const credentials = issued.find((candidate) => candidate.AccessKeyId === accessKeyId) as NonNullable<
              (typeof issued)[number]
            >;
            const sts = new STSClient({
              endpoint: moto.endpoint,
              region: aws.AWS_REGION,
              credentials: {
                accessKeyId,
                secretAccessKey: credentials.SecretAccessKey,
                sessionToken: credentials.Token,
              },
            });
            const { Arn } = await sts.send(new GetCallerIdentityCommand({}));
            sts.destroy();
            assert.match(
              Arn ?? '',
              new RegExp(`:assumed-role/${role}/`),
              `${role} (${connections}): credentials ${accessKeyId} are its own role's`,
            );
          }
          summary.push(
            `${role} ${connections}: ${issued.length} own-role credentials, refused/reset ${refusedInSwitch} while kube2iam was replaced and ${refused.length - refusedInSwitch} while the agent moved to 8181 (${[...new Set(refused.map((answer) => answer.error))].join(', ')}), ${otherBodies.length} other answers (${[...new Set(otherBodies.map((answer) => answer.body?.slice(0, 60)))].join(' | ')})`,
          );
          assert.equal(
            otherBodies.length,
            0,
            `${role} (${connections}): every answer was credentials or a connection error`,
          );
        }
      }
      console.log(`kube2iam -> agent: ${summary.join('; ')}`);
      assert.deepEqual(await moved.signal('SIGTERM'), { code: 0, signal: null });
    } finally {
      await Promise.all(everyClient.map((client) => client.stop().catch(() => undefined)));
      await old.stop();
      for (const agent of agents) await agent.kill();
    }
  });
});
