/**
 * A hostile pod against the real agent (a child process, as the DaemonSet runs it, at its shipped
 * log level), each attack of issue 17 from a network-namespace pod, bounded to a few seconds:
 * log floods of refused token PUTs and refused credential GETs, a connection storm, a pile of
 * waiting lookups, /events subscribers that never read, the proxy's never-proxied list, and the
 * admin port reached through route_localnet. Throughout each attack the agent's heap and RSS are
 * sampled from /metrics and a well-behaved pod fetches its credentials; each attack asserts the
 * agent stays up, stays under the memory bound, and keeps answering the well-behaved pod.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { type Socket, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { FakeKubeApi } from '../../src/sandbox/kube-api/server.js';
import { BASE_ROLE_ARN, NODE } from '../fixtures/agent.js';
import { curlInPod } from '../fixtures/clients.js';
import { eventually } from '../../testkit/eventually.js';
import { Moto, motoEnv } from '../../testkit/moto.js';
import { type NetnsPod, PodNetwork, requireHermetic } from '../fixtures/netns.js';
import { ChildAgent, sh } from '../fixtures/node.js';
import { type RecordingUpstream, startRecordingUpstream } from '../fixtures/upstream.js';

const LOAD_SCRIPT = fileURLToPath(new URL('../fixtures/metadata-load.mjs', import.meta.url));
const METADATA_PORT = 8181;
const ADMIN = '127.0.0.1:18182';
const METRICS = '127.0.0.1:18183';
const ATTACK_MS = 4_000;
const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';
/** The memory bound every attack is held to: the agent's RSS (under tsx, which itself costs about 60 MB more than dist/) and heap. */
const RSS_BOUND_MB = 256;
const HEAP_BOUND_MB = 128;
const CALLER_MAX_CONNECTIONS = 128;
const CALLER_MAX_WAITING = 32;
const EVENTS_MAX_SUBSCRIBERS = 16;
/** Requests one caller gets through in an attack at the default limit: the burst (200) plus 100/s, with a second of slack. */
const BUDGET = 200 + 100 * (ATTACK_MS / 1_000 + 1);

interface Memory {
  readonly rssMb: number;
  readonly heapMb: number;
}

interface Steady {
  readonly statuses: Record<string, number>;
  readonly failed: number;
  readonly failures: string[];
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
}

interface Flood {
  readonly statuses: Record<string, number>;
  readonly sent: number;
  readonly answered: number;
  readonly connects: number;
  readonly retryAfterSeen: boolean;
}

describe('a hostile pod against the agent', () => {
  let api: FakeKubeApi;
  let network: PodNetwork;
  let moto: Moto;
  let upstream: RecordingUpstream;
  let workDir: string;
  let agent: ChildAgent;
  let victim: NetnsPod;
  let attacker: NetnsPod;
  let stranger: NetnsPod;

  before(async () => {
    requireHermetic();
    network = await PodNetwork.create();
    [api, moto, upstream, workDir] = await Promise.all([
      FakeKubeApi.start(),
      Moto.start(network.nodeIp),
      startRecordingUpstream(),
      mkdtemp(join(tmpdir(), 'kib-hostile-')),
    ]);
    [victim, attacker, stranger] = await Promise.all([
      network.addPod('victim'),
      network.addPod('attacker'),
      network.addPod('stranger'),
    ]);
    api.upsertNamespace({ metadata: { name: 'default' } });
    for (const [pod, role] of [
      [victim, 'victim-role'],
      [attacker, 'attacker-role'],
    ] as const) {
      api.upsertPod({
        metadata: {
          name: pod === victim ? 'victim' : 'attacker',
          namespace: 'default',
          annotations: { 'iam.amazonaws.com/role': role },
        },
        spec: { nodeName: NODE, serviceAccountName: 'app' },
        status: { phase: 'Running', podIP: pod.ip, podIPs: [{ ip: pod.ip }] },
      });
    }
    agent = ChildAgent.start({
      ...motoEnv(moto.endpoint),
      KUBECONFIG: api.writeKubeconfig(workDir),
      BROKER_NODE_NAME: NODE,
      BROKER_LISTEN: `${network.nodeIp}:${METADATA_PORT}`,
      BROKER_ADMIN_LISTEN: ADMIN,
      BROKER_METRICS_LISTEN: METRICS,
      BROKER_BASE_ROLE_ARN: BASE_ROLE_ARN,
      BROKER_METADATA_UPSTREAM: upstream.url,
      // How a kiam user might migrate: everything allow-listed. The never-proxied list must still hold.
      BROKER_METADATA_ALLOW: '^/.*$',
      // Long enough that a waiting lookup is still waiting when its attack ends.
      BROKER_GRACE_WINDOW_MS: '10000',
      BROKER_CREDENTIAL_DEADLINE_MS: '11000',
      // Short, so a test sees the coalesced counts within seconds (the default is 10 s).
      BROKER_AUDIT_COALESCE_INTERVAL: '1s',
      BROKER_LOG_LEVEL: 'info',
      // The shipped heap limit (k8s/daemonset.yaml).
      NODE_OPTIONS: '--max-old-space-size=192',
    });
    await eventually(
      'the agent is ready',
      async () => (await fetch(`http://${ADMIN}/readyz`).catch(() => undefined))?.status === 200,
      90_000,
    );
    // The victim's credentials are cached before the attacks: what it measures is serving, not STS.
    assert.equal(await status(victim, `${CREDENTIALS}victim-role`), 200);
  });

  after(async () => {
    await agent?.kill();
    await Promise.all([
      api?.stop(),
      moto?.stop(),
      upstream?.stop(),
      network?.destroy(),
      workDir && rm(workDir, { recursive: true, force: true }),
    ]);
  });

  const endpoint = () => ({ host: network.nodeIp, port: METADATA_PORT });

  async function status(pod: NetnsPod, path: string, headers: string[] = []): Promise<number> {
    const result = await curlInPod(pod, [
      '-o',
      '/dev/null',
      '-w',
      '%{http_code}',
      ...headers.flatMap((header) => ['-H', header]),
      `http://${network.nodeIp}:${METADATA_PORT}${path}`,
    ]);
    return Number(result.stdout);
  }

  async function load<T>(pod: NetnsPod, options: Record<string, unknown>): Promise<T> {
    const result = await pod.exec([process.execPath, LOAD_SCRIPT, JSON.stringify({ ...endpoint(), ...options })], {
      timeoutMs: 60_000,
    });
    if (result.code !== 0) throw new Error(`load in ${pod.name} failed (${result.code}): ${result.stderr}`);
    return JSON.parse(result.stdout) as T;
  }

  async function metrics(): Promise<string> {
    return (await fetch(`http://${METRICS}/metrics`)).text();
  }

  const series = (text: string, name: string): number => {
    const line = text.split('\n').find((candidate) => candidate.startsWith(`${name} `));
    return line === undefined ? Number.NaN : Number(line.split(' ')[1]);
  };
  const metric = (text: string, name: string, labels = ''): number => series(text, `kube_iam_broker_${name}${labels}`);

  async function memory(): Promise<Memory> {
    const text = await metrics();
    return {
      rssMb: series(text, 'process_resident_memory_bytes') / 2 ** 20,
      heapMb: series(text, 'nodejs_heap_size_used_bytes') / 2 ** 20,
    };
  }

  /** The audit events of some types buffered in the agent, as `kube-iam-broker events --json` would print them. */
  async function auditEvents(types: string): Promise<Array<Record<string, unknown>>> {
    const text = await (
      await fetch(`http://${ADMIN}/events?follow=false&type=${types}`, { headers: { Accept: 'application/x-ndjson' } })
    ).text();
    return text
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as Record<string, unknown>);
  }

  /**
   * Runs an attack while sampling memory and while the well-behaved pod fetches its credentials
   * every 100 ms (on a new connection, as a fresh SDK client does); asserts the agent stayed up, under the bound, and answered the pod every time.
   */
  async function underAttack<T>(
    name: string,
    attack: () => Promise<T>,
  ): Promise<{ result: T; peak: Memory; victimLoad: Steady }> {
    const before = await memory();
    const samples: Memory[] = [before];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        samples.push(await memory());
        await new Promise((resolve) => setTimeout(resolve, 250));
      }
    })();
    const [result, victimLoad] = await Promise.all([
      attack(),
      load<Steady>(victim, {
        mode: 'steady',
        durationMs: ATTACK_MS,
        intervalMs: 100,
        request: { path: `${CREDENTIALS}victim-role` },
      }),
    ]);
    sampling = false;
    await sampler;
    const peak = {
      rssMb: Math.max(...samples.map((sample) => sample.rssMb)),
      heapMb: Math.max(...samples.map((sample) => sample.heapMb)),
    };
    console.log(
      `${name}: RSS ${before.rssMb.toFixed(0)} → peak ${peak.rssMb.toFixed(0)} MB, heap ${before.heapMb.toFixed(0)} → peak ${peak.heapMb.toFixed(0)} MB; ` +
        `well-behaved pod: ${JSON.stringify(victimLoad.statuses)}, ${victimLoad.failed} failed, p50 ${victimLoad.p50} ms, p99 ${victimLoad.p99} ms, max ${victimLoad.max} ms; attack: ${JSON.stringify(result)}`,
    );
    assert.equal((await fetch(`http://${ADMIN}/healthz`)).status, 200, 'the agent is up');
    assert.ok(peak.rssMb < RSS_BOUND_MB, `RSS peaked at ${peak.rssMb.toFixed(0)} MB (bound ${RSS_BOUND_MB} MB)`);
    assert.ok(peak.heapMb < HEAP_BOUND_MB, `heap peaked at ${peak.heapMb.toFixed(0)} MB (bound ${HEAP_BOUND_MB} MB)`);
    const answered = victimLoad.statuses['200'] ?? 0;
    assert.equal(victimLoad.failed, 0, `the well-behaved pod's requests failed: ${victimLoad.failures.join('; ')}`);
    assert.deepEqual(Object.keys(victimLoad.statuses), ['200'], 'the well-behaved pod got its credentials every time');
    // How fast it was answered is a benchmark (bench/fairness.ts), not a timed test: only that it was, within 5 s each time.
    assert.ok(answered >= 2, `the well-behaved pod got ${answered} answers`);
    return { result, peak, victimLoad };
  }

  const sumOfCounts = (events: Array<Record<string, unknown>>): number =>
    events.reduce((sum, event) => sum + ((event.count as number | undefined) ?? 1), 0);

  it('a flood of refused token PUTs from an unknown IP is throttled (429 + Retry-After), logged as nothing at info, and counted in a few events', async () => {
    const { result } = await underAttack('token flood', () =>
      load<Flood>(stranger, {
        mode: 'flood',
        connections: 50,
        pipeline: 20,
        durationMs: ATTACK_MS,
        request: { method: 'PUT', path: '/latest/api/token', headers: { 'X-aws-ec2-metadata-token-ttl-seconds': '0' } },
      }),
    );
    const refused = result.statuses['400'] ?? 0;
    const throttled = result.statuses['429'] ?? 0;
    assert.ok(
      throttled > 0 && result.retryAfterSeen,
      `the flood is throttled with Retry-After: ${JSON.stringify(result.statuses)}`,
    );
    assert.ok(
      refused > 0 && refused <= BUDGET,
      `only the caller's budget reaches the token check: ${refused} (budget ${BUDGET})`,
    );
    // One coalescing interval later every refusal is accounted for in events that carry counts.
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    const events = (await auditEvents('token.refused,request.throttled')).filter(
      (event) => event.podIp === stranger.ip,
    );
    const tokenRefusals = events.filter((event) => event.type === 'token.refused');
    const throttles = events.filter((event) => event.type === 'request.throttled');
    assert.ok(
      sumOfCounts(tokenRefusals) >= refused && sumOfCounts(tokenRefusals) <= refused + 1_000,
      `token.refused counts ${sumOfCounts(tokenRefusals)} vs ${refused} refusals seen`,
    );
    assert.ok(
      sumOfCounts(throttles) >= throttled,
      `request.throttled counts ${sumOfCounts(throttles)} vs ${throttled} 429s seen`,
    );
    assert.ok(
      events.length <= 2 * (ATTACK_MS / 1_000 + 3),
      `${events.length} events for ${refused + throttled} refusals`,
    );
    const metricsText = await metrics();
    assert.ok(
      metric(metricsText, 'requests_throttled_total', '{limit="rate"}') >= throttled,
      'throttled requests are counted in metrics',
    );
    assert.ok(
      !agent.logs.some((line) => line.event === 'token.refused'),
      'token refusals are debug, not logged at info',
    );
  });

  it('a flood of GETs for another role from a known pod costs one log line per interval, with the count', async () => {
    const logLinesBefore = agent.logs.length;
    const { result } = await underAttack('denied-credentials flood', () =>
      load<Flood>(attacker, {
        mode: 'flood',
        connections: 50,
        pipeline: 20,
        durationMs: ATTACK_MS,
        request: { path: `${CREDENTIALS}not-my-role` },
      }),
    );
    const denied = result.statuses['404'] ?? 0;
    assert.ok(
      denied > 0 && denied <= BUDGET && (result.statuses['429'] ?? 0) > 0,
      `only the caller's budget (${BUDGET}) reaches the decision: ${JSON.stringify(result.statuses)}`,
    );
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    const lines = agent.logs
      .slice(logLinesBefore)
      .filter((line) => line.podIp === attacker.ip && line.event === 'credential.denied');
    assert.ok(lines.length <= ATTACK_MS / 1_000 + 3, `${lines.length} log lines for ${denied} denials`);
    const counted = lines.reduce((sum, line) => sum + (line.count ?? 1), 0);
    assert.ok(
      counted >= denied && counted <= denied + 1_000,
      `the log lines count ${counted} denials, the pod saw ${denied}`,
    );
    assert.ok(
      agent.logs.some(
        (line) => line.event === 'request.throttled' && line.podIp === attacker.ip && typeof line.count === 'number',
      ),
      'throttling is logged, coalesced',
    );
  });

  it('a connection storm from one pod holds at most its per-caller connection cap', async () => {
    const { result } = await underAttack('connection storm', () =>
      load<{ accepted: number; closedEarly: number; openAtEnd: number }>(attacker, {
        mode: 'hold',
        connections: 1_000,
        durationMs: ATTACK_MS - 500,
      }),
    );
    assert.ok(
      result.openAtEnd <= CALLER_MAX_CONNECTIONS,
      `${result.openAtEnd} connections held open (cap ${CALLER_MAX_CONNECTIONS})`,
    );
    assert.ok(
      result.openAtEnd >= CALLER_MAX_CONNECTIONS / 2,
      `the cap, not something else, refused the rest: ${result.openAtEnd} held`,
    );
    const refused = await eventually('the refused connections are counted', async () => {
      const value = metric(await metrics(), 'requests_throttled_total', '{limit="connections"}');
      return value >= 1_000 - CALLER_MAX_CONNECTIONS ? value : undefined;
    });
    assert.ok(refused >= 1_000 - CALLER_MAX_CONNECTIONS);
  });

  it('an unknown pod piling up waiting lookups gets 429 beyond its cap', async () => {
    const { result } = await underAttack('waiting lookups', () =>
      load<Flood>(stranger, {
        mode: 'flood',
        connections: 200,
        pipeline: 1,
        durationMs: ATTACK_MS,
        request: { path: `${CREDENTIALS}any-role` },
      }),
    );
    assert.ok((result.statuses['429'] ?? 0) >= 200 - CALLER_MAX_WAITING, JSON.stringify(result.statuses));
    await eventually('the refused waits are audited', async () =>
      (await auditEvents('request.throttled')).some(
        (event) => event.podIp === stranger.ip && event.limit === 'waiting',
      ),
    );
  });

  it('/events takes at most its subscriber cap, each bounded, however many connect and never read', async () => {
    const sockets: Socket[] = [];
    const statuses: string[] = [];
    try {
      await underAttack('/events subscribers', async () => {
        const [host, port] = ADMIN.split(':') as [string, string];
        await Promise.all(
          Array.from(
            { length: EVENTS_MAX_SUBSCRIBERS + 8 },
            () =>
              new Promise<void>((resolve) => {
                const socket = connect({ host, port: Number(port) }, () =>
                  socket.write(
                    'GET /events?backlog=true HTTP/1.1\r\nHost: admin\r\nAccept: application/x-ndjson\r\n\r\n',
                  ),
                );
                sockets.push(socket);
                // Read only the status line, then never again.
                socket.once('data', (chunk) => {
                  statuses.push(/^HTTP\/1\.1 (\d{3})/.exec(chunk.toString('latin1'))?.[1] ?? '?');
                  socket.pause();
                  resolve();
                });
                socket.on('error', () => resolve());
              }),
          ),
        );
        // Events keep coming while they do not read.
        await load<Flood>(attacker, {
          mode: 'flood',
          connections: 10,
          pipeline: 10,
          durationMs: ATTACK_MS - 500,
          request: { path: `${CREDENTIALS}not-my-role` },
        });
        return {
          subscribers: statuses.filter((code) => code === '200').length,
          refused: statuses.filter((code) => code === '503').length,
        };
      });
      assert.equal(statuses.filter((code) => code === '200').length, EVENTS_MAX_SUBSCRIBERS);
      assert.equal(statuses.filter((code) => code === '503').length, 8);
    } finally {
      for (const socket of sockets) socket.destroy();
    }
  });

  it('never proxies user data, identity documents or credential paths in any letter case, whatever the allow-list says', async () => {
    const forbidden = [
      '/latest/user-data',
      '/latest/USER-DATA',
      '/latest/user-data/',
      '/latest/dynamic/instance-identity/document',
      '/latest/dynamic/instance-identity/pkcs7',
      '/latest/dynamic/instance-identity/signature',
      '/latest/dynamic/instance-identity/rsa2048',
      '/latest/dynamic/Instance-Identity/document',
      '/latest/meta-data/IAM/security-credentials/',
      '/latest/meta-data/iam/SECURITY-CREDENTIALS/',
      '/latest/meta-data/Iam/Security-Credentials/node-role',
      '/latest/meta-data/identity-credentials/ec2/security-credentials/ec2-instance',
      '/2021-01-03/user-data',
    ];
    const before = upstream.requests.length;
    for (const path of forbidden) assert.equal(await status(victim, path), 404, path);
    assert.equal(await status(victim, '/latest/meta-data/instance-id'), 200, 'an allow-listed path is still proxied');
    const reached = upstream.requests
      .slice(before)
      .map((request) => request.url)
      .filter((url) => url !== '/latest/api/token');
    assert.deepEqual(reached, ['/latest/meta-data/instance-id']);
  });

  it('a pod reaching the admin port through route_localnet (CVE-2020-8558) gets the probes but not /debug or /events', async () => {
    // What kube-proxy's localhost NodePorts do: DNAT to 127.0.0.1, allowed by route_localnet on the pods' interface.
    const rule = [
      'PREROUTING',
      '-i',
      network.bridge,
      '-d',
      network.nodeIp,
      '-p',
      'tcp',
      '--dport',
      '18999',
      '-j',
      'DNAT',
      '--to-destination',
      ADMIN,
    ];
    await writeFile(`/proc/sys/net/ipv4/conf/${network.bridge}/route_localnet`, '1');
    const added = await sh('iptables', '-w', '5', '-t', 'nat', '-I', ...rule);
    assert.equal(added.code, 0, added.stderr);
    try {
      const admin = (path: string) =>
        curlInPod(victim, ['-o', '/dev/null', '-w', '%{http_code}', `http://${network.nodeIp}:18999${path}`]).then(
          (result) => result.stdout,
        );
      assert.equal(await admin('/healthz'), '200', 'the admin port is reachable from the pod this way');
      assert.equal(await admin('/debug/pods'), '401');
      assert.equal(await admin('/events?follow=false'), '401');
      assert.equal(
        (await fetch(`http://${ADMIN}/debug/pods`)).status,
        200,
        'from the node itself it stays open (the demo, the events CLI)',
      );
    } finally {
      await sh('iptables', '-w', '5', '-t', 'nat', '-D', ...rule);
    }
  });
});
