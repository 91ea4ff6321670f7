/**
 * The credential event stream as operators consume it: a real EventSource client and curl on
 * GET /events while pods (network namespaces) fetch credentials with curl and the JS SDK; resume
 * with Last-Event-ID; a stalled subscriber; filters; the admin token; the `events` CLI.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { EventSource } from 'eventsource';
import { AUDIT_EVENT_TYPES, type AuditEvent } from '../../src/audit/events.js';
import { type StreamMessage, StreamMessageSchema } from '../../src/audit/stream-message.js';
import { ConfigError } from '../../src/config/load.js';
import { ACCOUNT, AgentHarness, BASE_ROLE_ARN, imdsGet } from '../fixtures/agent.js';
import { curlInPod, jsSdkCredentials } from '../fixtures/clients.js';
import type { NetnsPod } from '../fixtures/netns.js';
import { WatchedProcess } from '../fixtures/output-watcher.js';

const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';
const CLI = [process.execPath, '--import', 'tsx', new URL('../../src/cli.ts', import.meta.url).pathname, 'events'];

interface SseMessage {
  readonly id: string | undefined;
  readonly event: string;
  readonly data: StreamMessage;
}

/** SSE text as the spec frames it: messages separated by a blank line; comment lines start with ':'. */
function parseSse(text: string): SseMessage[] {
  return text
    .split('\n\n')
    .map((block) => block.split('\n').filter((line) => line !== '' && !line.startsWith(':')))
    .filter((lines) => lines.some((line) => line.startsWith('data: ')))
    .map((lines) => {
      const field = (name: string) => lines.find((line) => line.startsWith(`${name}: `))?.slice(name.length + 2);
      return {
        id: field('id'),
        event: field('event') ?? 'message',
        data: StreamMessageSchema.parse(JSON.parse(field('data') ?? '')),
      };
    });
}

const parseNdjson = (text: string): StreamMessage[] =>
  text
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => StreamMessageSchema.parse(JSON.parse(line)));

/** issueTokens makes events in bulk from one address: above the default per-caller request budget. */
const BULK_TOKENS = { BROKER_CALLER_RATE: '100000', BROKER_CALLER_BURST: '100000' };

/** Token PUTs from the node's own address: cheap audit events (token.issued). */
async function issueTokens(harness: AgentHarness, count: number): Promise<void> {
  for (let sent = 0; sent < count; sent += 50) {
    await Promise.all(
      Array.from({ length: Math.min(50, count - sent) }, async () => {
        const response = await fetch(`${harness.imdsEndpoint}/latest/api/token`, {
          method: 'PUT',
          headers: { 'X-aws-ec2-metadata-token-ttl-seconds': '60' },
        });
        assert.equal(response.status, 200);
        await response.text();
      }),
    );
  }
}

describe('audit events: GET /events on the admin port', () => {
  let harness: AgentHarness;
  let reader: NetnsPod;
  let newcomer: NetnsPod;

  before(async () => {
    harness = await AgentHarness.create();
    [reader, newcomer] = (await Promise.all(['reader', 'newcomer'].map((name) => harness.addNetnsPod(name)))) as [
      NetnsPod,
      NetnsPod,
    ];
    harness.api.upsertNamespace({ metadata: { name: 'shop' } });
    harness.schedulePod({ name: 'reader', namespace: 'shop', role: 'app-reader', ip: reader.ip });
    // A long grace window, so a request from a pod not yet scheduled is surely resolved by its pod's arrival.
    await harness.startAgent({
      BROKER_GRACE_WINDOW_MS: '10000',
      BROKER_EVENTS_BUFFER: '200',
      BROKER_EVENTS_SUBSCRIBER_BUFFER_BYTES: '16384',
      BROKER_EVENTS_HEARTBEAT: '1',
      ...BULK_TOKENS,
    });
    await harness.waitUntilReady();
    // STS (moto) answers first calls slowly on a loaded machine, and the JS SDK gives up after 1 s: have the reader's credentials cached.
    assert.equal((await imdsGet(reader, `${harness.imdsEndpoint}${CREDENTIALS}app-reader`)).status, 200);
  });
  after(() => harness?.stop());

  it('an EventSource client and curl receive each credential decision in order, with who, which role, how and how long', async () => {
    const source = new EventSource(`${harness.adminEndpoint}/events?namespace=shop`);
    const viaEventSource: Array<{ lastEventId: string; type: string; data: AuditEvent }> = [];
    for (const type of AUDIT_EVENT_TYPES)
      source.addEventListener(type, (message) =>
        viaEventSource.push({ lastEventId: message.lastEventId, type: message.type, data: JSON.parse(message.data) }),
      );
    const curl = WatchedProcess.spawn(['curl', '-sN', `${harness.adminEndpoint}/events?namespace=shop`]);
    try {
      await new Promise((resolve, reject) => {
        source.addEventListener('open', resolve, { once: true });
        source.addEventListener('error', reject, { once: true });
      });
      await curl.waitFor((text) => text.includes('retry:'));

      const sdk = await jsSdkCredentials(reader, harness.imdsEndpoint, harness.moto.endpoint);
      assert.ok(sdk.ok, sdk.error);
      const wrongRole = await imdsGet(reader, `${harness.imdsEndpoint}${CREDENTIALS}app-writer`);
      assert.equal(wrongRole.status, 404);
      // A pod that asks before the agent knows it: the wait ends when its pod is scheduled.
      const early = curlInPod(newcomer, [
        '-s',
        '-o',
        '/dev/null',
        '-w',
        '%{http_code}',
        `${harness.imdsEndpoint}${CREDENTIALS}app-new`,
      ]);
      const waitDeadline = Date.now() + 10_000;
      while (harness.agent.index.waitingKeys() === 0 && Date.now() < waitDeadline)
        await new Promise((resolve) => setTimeout(resolve, 10));
      assert.equal(harness.agent.index.waitingKeys(), 1, 'the request is waiting for its pod');
      harness.schedulePod({ name: 'newcomer', namespace: 'shop', role: 'app-new', ip: newcomer.ip });
      assert.equal((await early).stdout, '200');

      const isDone = (messages: ReadonlyArray<{ data: AuditEvent | StreamMessage }>) =>
        messages.some(({ data }) => data.type === 'credential.issued' && data.pod === 'newcomer');
      const deadline = Date.now() + 10_000;
      while (!(isDone(viaEventSource) && isDone(parseSse(curl.stdout))) && Date.now() < deadline)
        await new Promise((resolve) => setTimeout(resolve, 20));

      const fromCurl = parseSse(curl.stdout);
      assert.deepEqual(
        viaEventSource.map(({ data }) => data),
        fromCurl.map(({ data }) => data),
        'both clients saw the same events',
      );
      for (const message of fromCurl)
        assert.equal(message.id, String((message.data as AuditEvent).id), 'SSE id: is the event id');
      assert.deepEqual(
        viaEventSource.map(({ lastEventId, type }) => ({ lastEventId, type })),
        viaEventSource.map(({ data }) => ({ lastEventId: String(data.id), type: data.type })),
        'EventSource sees event: = type and id: = id',
      );
      const events = viaEventSource.map(({ data }) => data);
      const ids = events.map((event) => event.id);
      assert.deepEqual(
        ids,
        [...ids].sort((a, b) => a - b),
        'in publication order',
      );
      assert.ok(
        events.every((event) => event.namespace === 'shop'),
        'only namespace shop',
      );

      const decisions = events
        .filter((event) => event.type !== 'token.issued')
        .map((event) => `${event.type} ${event.pod}`);
      assert.deepEqual(decisions, [
        'credential.issued reader',
        'credential.denied reader',
        'pod.indexed newcomer',
        'lookup.waited newcomer',
        'credential.issued newcomer',
      ]);
      const [issued, denied, , waited, pushed] = events.filter((event) => event.type !== 'token.issued');
      assert.ok(
        events.findIndex((event) => event.type === 'token.issued' && event.pod === 'reader') <
          events.indexOf(issued as AuditEvent),
        "the SDK's token PUT came first",
      );
      assert.deepEqual(
        { ...issued, id: 0, time: '', requestId: '', expiration: '', waitedMs: 0, cache: undefined },
        {
          v: 1,
          id: 0,
          time: '',
          type: 'credential.issued',
          requestId: '',
          podIp: reader.ip,
          namespace: 'shop',
          pod: 'reader',
          serviceAccount: 'app',
          roleArn: `${BASE_ROLE_ARN}app-reader`,
          door: 'metadata',
          source: 'annotation',
          resolvedBy: 'index',
          waitedMs: 0,
          expiration: '',
          cache: undefined,
        },
      );
      // Prefetched at pod arrival ('hit'), or joined while that fetch was still in flight.
      assert.ok(issued?.type === 'credential.issued' && issued.cache !== 'stale', JSON.stringify(issued));
      assert.match(issued?.requestId ?? '', /^[0-9a-f-]{36}$/);
      assert.ok(
        denied?.type === 'credential.denied' &&
          denied.status === 404 &&
          denied.requestedRole === 'app-writer' &&
          /not this pod's role/.test(denied.reason),
        JSON.stringify(denied),
      );
      assert.ok(
        waited?.type === 'lookup.waited' && waited.outcome === 'push' && waited.waitedMs > 0,
        JSON.stringify(waited),
      );
      assert.ok(
        pushed?.type === 'credential.issued' &&
          pushed.resolvedBy === 'push' &&
          pushed.roleArn === `arn:aws:iam::${ACCOUNT}:role/app-new`,
        JSON.stringify(pushed),
      );
      console.log(
        `newcomer waited ${waited?.type === 'lookup.waited' ? Math.round(waited.waitedMs) : '?'} ms for its pod (scheduled once its request was waiting)`,
      );
    } finally {
      source.close();
      await curl.stop();
    }
  });

  it('filters by type (exact names and prefixes), namespace and pod; rejects an unknown type', async () => {
    const read = async (query: string) =>
      parseNdjson(
        await (
          await fetch(`${harness.adminEndpoint}/events?follow=false&${query}`, {
            headers: { Accept: 'application/x-ndjson' },
          })
        ).text(),
      ) as AuditEvent[];
    const credentialOnly = await read('type=credential.*');
    assert.ok(credentialOnly.length >= 3);
    assert.deepEqual(
      new Set(credentialOnly.map((event) => event.type)),
      new Set(['credential.issued', 'credential.denied']),
    );
    const readerOnly = await read('pod=reader&type=credential.issued,lookup.waited');
    assert.ok(
      readerOnly.length > 0 &&
        readerOnly.every((event) => event.pod === 'reader' && event.type === 'credential.issued'),
    );
    const elsewhere = await read('namespace=kube-system');
    assert.deepEqual(elsewhere, []);
    const bad = await fetch(`${harness.adminEndpoint}/events?type=credential.bogus`);
    assert.equal(bad.status, 400);
    assert.match(await bad.text(), /matches no event type/);
  });

  it('a credential request refused for its session token is a credential.denied event too', async () => {
    const response = await imdsGet(reader, `${harness.imdsEndpoint}${CREDENTIALS}app-reader`, {
      'X-aws-ec2-metadata-token': 'not-a-token',
    });
    assert.equal(response.status, 401);
    const denied = await harness.nextEvent((event) => event.type === 'credential.denied' && event.status === 401);
    assert.deepEqual(
      { pod: denied.pod, namespace: denied.namespace, podIp: denied.podIp },
      { pod: 'reader', namespace: 'shop', podIp: reader.ip },
    );
  });

  it('a subscriber resuming with Last-Event-ID gets every buffered event after it, and a counted gap for what is no longer buffered', async () => {
    await issueTokens(harness, 20);
    const all = parseNdjson(
      await (
        await fetch(`${harness.adminEndpoint}/events?follow=false`, { headers: { Accept: 'application/x-ndjson' } })
      ).text(),
    ) as AuditEvent[];
    const resumeFrom = all.at(-15)?.id as number;
    await issueTokens(harness, 10); // published while "disconnected"

    const resumed = parseNdjson(
      await (
        await fetch(`${harness.adminEndpoint}/events?follow=false`, {
          headers: { Accept: 'application/x-ndjson', 'Last-Event-ID': String(resumeFrom) },
        })
      ).text(),
    ) as AuditEvent[];
    const ids = resumed.map((event) => event.id);
    assert.equal(ids[0], resumeFrom + 1, 'starts right after the last event seen');
    assert.deepEqual(
      ids,
      Array.from({ length: ids.length }, (_, i) => resumeFrom + 1 + i),
      'no id skipped',
    );
    assert.equal(ids.length, 14 + 10);

    // The buffer holds 200 events: resuming from before the oldest one says how many are lost.
    await issueTokens(harness, 200);
    const tooOld = parseNdjson(
      await (
        await fetch(`${harness.adminEndpoint}/events?follow=false`, {
          headers: { Accept: 'application/x-ndjson', 'Last-Event-ID': String(resumeFrom) },
        })
      ).text(),
    );
    const [gap, firstBuffered] = tooOld;
    assert.equal(gap?.type, 'stream.gap');
    assert.ok(gap?.type === 'stream.gap' && firstBuffered && 'id' in firstBuffered);
    assert.equal(gap.reason, 'not-buffered');
    assert.equal(gap.dropped, firstBuffered.id - resumeFrom - 1);
    assert.equal(tooOld.length, 1 + 200);
  });

  it('sends heartbeat comments to an idle subscriber', async () => {
    const curl = WatchedProcess.spawn(['curl', '-sN', `${harness.adminEndpoint}/events?namespace=nobody`]);
    try {
      await curl.waitFor((text) => text.includes(': heartbeat'), 5_000);
    } finally {
      await curl.stop();
    }
  });
});

describe('audit events: admin token and the events CLI', () => {
  const TOKEN = 'test-admin-token-0123456789';
  let harness: AgentHarness;
  let pod: NetnsPod;

  before(async () => {
    harness = await AgentHarness.create();
    pod = await harness.addNetnsPod('cli');
    harness.schedulePod({ name: 'cli', role: 'app-cli', ip: pod.ip });
  });
  after(() => harness?.stop());

  it('refuses to start with the admin server beyond loopback and no token', async () => {
    await assert.rejects(
      harness.startAgent({ BROKER_ADMIN_LISTEN: '0.0.0.0:0' }),
      (error: unknown) => error instanceof ConfigError && /BROKER_ADMIN_TOKEN/.test(error.message),
    );
  });

  it('beyond loopback, /events and /debug/* need the bearer token (pods included); probes do not; the token is never logged', async () => {
    await harness.startAgent({
      BROKER_ADMIN_LISTEN: '0.0.0.0:0',
      BROKER_ADMIN_TOKEN: TOKEN,
      BROKER_EVENTS_SUBSCRIBER_BUFFER_BYTES: '16384',
      ...BULK_TOKENS,
    });
    await harness.waitUntilReady();
    const status = async (path: string, authorization?: string) =>
      (
        await fetch(`${harness.adminEndpoint}${path}?follow=false`, {
          headers: authorization ? { Authorization: authorization } : {},
        })
      ).status;
    assert.equal(await status('/events'), 401);
    assert.equal(await status('/events', `Bearer ${TOKEN}x`), 401);
    assert.equal(await status('/events', 'Bearer short'), 401);
    assert.equal(await status('/debug/pods'), 401);
    assert.equal(await status('/events', `Bearer ${TOKEN}`), 200);
    assert.equal(await status('/debug/pods', `Bearer ${TOKEN}`), 200);
    assert.equal(await status('/healthz'), 200);
    const fromPod = await curlInPod(pod, [
      '-s',
      '-o',
      '/dev/null',
      '-w',
      '%{http_code}',
      `http://${harness.network.nodeIp}:${harness.agent.admin.address.port}/events?follow=false`,
    ]);
    assert.equal(fromPod.stdout, '401', 'a pod reaching the admin port is refused');
    assert.ok(!harness.logs.join('\n').includes(TOKEN), 'the token is not in the logs');
  });

  it('a stalled subscriber never delays credential responses, and gets a gap event with the count once it reads again', async () => {
    const tokenEventsBefore = harness.events.filter((event) => event.type === 'token.issued').length;
    // A raw socket with a 4 KiB receive buffer that reads nothing after the response headers until told to.
    // From a pod across a veth (MTU 1500), the agent's kernel send buffer stays small; over loopback (MTU 64 KiB) it grows to megabytes.
    const stalled = WatchedProcess.spawn([
      'ip',
      'netns',
      'exec',
      pod.name,
      'python3',
      '-c',
      STALLED_CLIENT,
      harness.network.nodeIp,
      String(harness.agent.admin.address.port),
      '/events?type=token.issued,pod.indexed',
      '"pod":"after-stall"',
      TOKEN,
    ]);
    try {
      await stalled.waitFor((text) => text.startsWith('subscribed\n'));
      const timings = async () => {
        const measured: number[] = [];
        for (let i = 0; i < 5; i++) {
          const started = performance.now();
          const response = await imdsGet(pod, `${harness.imdsEndpoint}${CREDENTIALS}app-cli`);
          measured.push(performance.now() - started);
          assert.equal(response.status, 200);
        }
        return measured.map((ms) => Math.round(ms));
      };
      const baseline = await timings();
      const generated = 3_000;
      const publishStarted = performance.now();
      await issueTokens(harness, generated);
      const publishMs = performance.now() - publishStarted;
      const whileStalled = await timings();
      console.log(
        `credential GETs from a pod (curl, ms) before the stall: ${baseline.join(' ')}; with a stalled subscriber and ${generated} events behind it: ${whileStalled.join(' ')}; ${generated} token PUTs took ${Math.round(publishMs)} ms`,
      );

      stalled.child.stdin?.end('read\n');
      // Once the gap has been delivered, events flow again: this one must arrive.
      await stalled.waitFor((text) => text.includes('gap-seen\n'), 20_000);
      harness.schedulePod({ name: 'after-stall', ip: '10.254.0.9' });
      assert.equal(await stalled.exit(30_000), 0, stalled.stderr);
      const body = stalled.stdout.slice(stalled.stdout.indexOf('\r\n\r\n') + 4);
      const messages = parseSse(body);
      const gaps = messages.flatMap((message) => (message.data.type === 'stream.gap' ? [message.data] : []));
      assert.ok(
        gaps.length >= 1,
        'at least one gap (the kernel may take more data as its buffer grows, and so drain in steps)',
      );
      assert.ok(
        gaps.every(
          (gap) =>
            gap.reason === 'subscriber-too-slow' &&
            gap.dropped > 0 &&
            gap.firstId !== undefined &&
            gap.lastId !== undefined,
        ),
        JSON.stringify(gaps),
      );
      // Every event published meanwhile was either delivered or lies in exactly one gap's id range, which counts it.
      const published = harness.events
        .filter((event) => event.type === 'token.issued')
        .slice(tokenEventsBefore)
        .map((event) => event.id);
      const delivered = new Set(
        messages.flatMap((message) => (message.data.type === 'token.issued' ? [message.data.id] : [])),
      );
      const inGap = (id: number) =>
        gaps.filter((gap) => id >= (gap.firstId as number) && id <= (gap.lastId as number)).length;
      for (const id of published)
        assert.equal(Number(delivered.has(id)) + inGap(id), 1, `event ${id} delivered or counted once`);
      const dropped = gaps.reduce((sum, gap) => sum + gap.dropped, 0);
      assert.equal(delivered.size + dropped, published.length);
      const last = messages.at(-1)?.data;
      assert.equal(last?.type === 'pod.indexed' && last.pod, 'after-stall', 'delivery resumes after the gap');
      console.log(
        `stalled subscriber: received ${delivered.size} of ${published.length} events; ${gaps.length} gap event(s) counted ${dropped} dropped`,
      );
    } finally {
      await stalled.stop();
    }
  });

  it('`events` prints one readable line per event; --json prints NDJSON; --follow resumes after the agent restarts', async () => {
    const env = {
      ...process.env,
      BROKER_ADMIN_TOKEN: TOKEN,
      BROKER_ADMIN_LISTEN: `127.0.0.1:${harness.agent.admin.address.port}`,
    };
    assert.equal((await imdsGet(pod, `${harness.imdsEndpoint}${CREDENTIALS}app-cli`)).status, 200);
    await harness.nextEvent((event) => event.type === 'credential.issued');

    const once = WatchedProcess.spawn([...CLI, '--type', 'credential.*'], env);
    assert.equal(await once.exit(30_000), 0, once.stderr);
    const line = once.stdout.trim().split('\n').at(-1) ?? '';
    console.log(`human format: ${line}`);
    assert.match(
      line,
      /^\d{4}-\d\d-\d\dT\S+Z credential\.issued +[\d.]+ default\/cli +role arn:aws:iam::\d{12}:role\/app-cli \(annotation\), resolved by index after 0 ms, expires \S+$/,
    );

    const json = WatchedProcess.spawn([...CLI, '--json', '--namespace', 'default'], env);
    assert.equal(await json.exit(30_000), 0, json.stderr);
    const lines = parseNdjson(json.stdout);
    assert.ok(lines.some((message) => message.type === 'credential.issued' && message.pod === 'cli'));

    const unauthorized = WatchedProcess.spawn([...CLI], { ...env, BROKER_ADMIN_TOKEN: '' });
    assert.equal(await unauthorized.exit(30_000), 2);
    assert.match(unauthorized.stderr, /401/);

    const follow = WatchedProcess.spawn([...CLI, '--follow', '--type', 'credential.issued'], env);
    const printed = () => follow.stdout.split('\n').filter(Boolean).length;
    /** Makes a credential request and returns its event; each printed line starts with its event's time. */
    const issueCredentials = async () => {
      const after = harness.events.at(-1)?.id ?? 0;
      assert.equal((await imdsGet(pod, `${harness.imdsEndpoint}${CREDENTIALS}app-cli`)).status, 200);
      return harness.nextEvent((event) => event.type === 'credential.issued' && event.id > after);
    };
    try {
      await follow.waitFor(() => printed() > 0, 20_000); // the buffered events first: it is connected
      const live = await issueCredentials();
      await follow.waitFor(() => follow.stdout.includes(live.time));

      const adminPort = harness.agent.admin.address.port;
      await harness.agent.stop();
      await harness.startAgent({ BROKER_ADMIN_LISTEN: `127.0.0.1:${adminPort}`, BROKER_ADMIN_TOKEN: TOKEN });
      await harness.waitUntilReady();
      const restartedAt = Date.now();
      // The CLI reconnects with the old run's Last-Event-ID: the new run's events are all after it.
      const afterRestart = await issueCredentials();
      await follow.waitFor(() => follow.stdout.includes(afterRestart.time), 15_000);
      console.log(
        `the CLI printed the restarted agent's first credential event ${Date.now() - restartedAt} ms after the restart`,
      );
      assert.match(
        follow.stdout.trim().split('\n').at(-1) ?? '',
        /credential\.issued +[\d.]+ default\/cli +role \S+app-cli/,
      );
    } finally {
      await follow.stop();
    }
  });
});

/** Subscribes, reads nothing more until a line arrives on stdin, then reads until the gap (says so) and the marker (bounded), and prints it all. */
const STALLED_CLIENT = `
import socket, sys, time
host, port, path, marker, token = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].encode(), sys.argv[5]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect((host, port))
s.sendall(('GET %s HTTP/1.0\\r\\nHost: admin\\r\\nAuthorization: Bearer %s\\r\\n\\r\\n' % (path, token)).encode())
data = b''
while b'retry:' not in data:
    data += s.recv(1)
sys.stdout.write('subscribed\\n'); sys.stdout.flush()
sys.stdin.readline()
s.settimeout(1)
deadline = time.time() + 20
def read_until(wanted):
    global data
    while wanted not in data and time.time() < deadline:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            break
        data += chunk
read_until(b'event: stream.gap')
sys.stdout.write('gap-seen\\n'); sys.stdout.flush()
read_until(marker)
sys.stdout.write(data.decode())
sys.exit(0 if marker in data else 1)
`;
