/**
 * Hostile input on the metadata port, from raw sockets of this process: fuzzed methods, paths
 * (encoded, dot segments, very long, role names with slashes), headers (huge tokens, bad TTLs,
 * duplicates, X-Forwarded-For variants), bodies, slow and aborted clients. The agent must not
 * crash, must answer a 4xx with a reason, must never hand out credentials for a role the caller's
 * pod does not have, must forward nothing upstream beyond the allow-list (a recording stand-in
 * plays the node's metadata service), and must stay within bounded memory.
 */
import assert from 'node:assert/strict';
import { type Socket, connect } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import fc from 'fast-check';
import { loadConfig } from '../../src/config/load.js';
import { AgentHarness, BASE_ROLE_ARN } from '../fixtures/agent.js';
import { eventually } from '../../testkit/eventually.js';
import { type RecordingUpstream, startRecordingUpstream } from '../fixtures/upstream.js';

/** The test process is this pod: its sockets are bound to this loopback address. */
const POD_IP = '127.0.0.3';
/** No pod has this address: its requests wait for the grace window. */
const STRANGER_IP = '127.0.0.4';
const ROLE = 'fuzz-role';
const GRACE_WINDOW_MS = 20_000;
const CREDENTIAL_PATHS = new Set([
  `/latest/meta-data/iam/security-credentials/${ROLE}`,
  `/latest/meta-data/iam/security-credentials-extended/${ROLE}`,
]);
/** The default allow-list, the one the agent runs with here. */
const ALLOW = new RegExp(loadConfig([], {}).metadataAllow);

interface RawResponse {
  readonly status: number | undefined;
  readonly head: string;
  readonly body: string;
  readonly closedAfterMs: number;
}

describe('hostile input on the metadata port', () => {
  let harness: AgentHarness;
  let upstream: RecordingUpstream;
  const crashes: unknown[] = [];
  const recordCrash = (error: unknown) => void crashes.push(error);

  before(async () => {
    process.on('unhandledRejection', recordCrash);
    process.on('uncaughtException', recordCrash);
    harness = await AgentHarness.create();
    upstream = await startRecordingUpstream();
    harness.schedulePod({ name: 'fuzzer', role: ROLE, ip: POD_IP });
    // A grace window far longer than any wait below: a waiter that disappears did so because its client went away.
    await harness.startAgent({
      BROKER_METADATA_UPSTREAM: upstream.url,
      BROKER_GRACE_WINDOW_MS: String(GRACE_WINDOW_MS),
      BROKER_LOG_LEVEL: 'warn',
    });
    await harness.waitUntilReady();
  });
  after(async () => {
    await harness?.stop();
    await upstream?.stop();
    process.off('unhandledRejection', recordCrash);
    process.off('uncaughtException', recordCrash);
  });

  const port = () => harness.agent.imds.address.port;

  /** Sends raw bytes from a source address and reads until the server closes or the bound passes. */
  const raw = (request: string | Buffer, { from = POD_IP, boundMs = 5_000 } = {}): Promise<RawResponse> =>
    new Promise((resolve) => {
      const started = performance.now();
      const chunks: Buffer[] = [];
      const socket = connect({ host: harness.network.nodeIp, port: port(), localAddress: from }, () =>
        socket.write(request),
      );
      const bound = setTimeout(() => socket.destroy(), boundMs);
      socket.on('data', (chunk) => chunks.push(chunk));
      socket.on('error', () => undefined);
      socket.on('close', () => {
        clearTimeout(bound);
        // An interim "100 Continue" (the request said Expect: 100-continue) precedes the real answer.
        const text = Buffer.concat(chunks)
          .toString('latin1')
          .replace(/^HTTP\/1\.1 100 Continue\r\n\r\n/, '');
        const [head = '', ...rest] = text.split('\r\n\r\n');
        resolve({
          status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1]) || undefined,
          head,
          body: rest.join('\r\n\r\n'),
          closedAfterMs: performance.now() - started,
        });
      });
    });

  const get = (path: string, headers: string[] = []) =>
    raw(
      `GET ${path} HTTP/1.1\r\nHost: 169.254.169.254\r\n${headers.map((h) => `${h}\r\n`).join('')}Connection: close\r\n\r\n`,
    );

  // ---- the fuzzer ----------------------------------------------------------------------------------

  const segment = fc.oneof(
    fc.constantFrom(
      'latest',
      'meta-data',
      'iam',
      'security-credentials',
      'security-credentials-extended',
      'info',
      'api',
      'token',
      ROLE,
      'other-role',
      'identity-credentials',
      'ec2',
      'placement',
      'region',
      'instance-id',
      'user-data',
    ),
    fc.constantFrom(
      '..',
      '.',
      '%2e%2e',
      '%2E',
      '%2F',
      '%00',
      '',
      `${ROLE}%2F..%2Fother`,
      'fuzz%2Drole',
      'a'.repeat(600),
      'ü',
      '\u2028',
      ' ',
      '\t',
      '%',
      '*',
      '?x=1',
      '#frag',
      ';',
      '@',
      'http:',
    ),
    fc.string({ maxLength: 12 }),
  );
  const path = fc.oneof(
    fc.array(segment, { maxLength: 7 }).map((segments) => `/${segments.join('/')}`),
    fc.constantFrom(
      '*',
      'http://evil.example/latest/meta-data/iam/security-credentials/',
      `//latest/meta-data/iam/security-credentials/${ROLE}`,
      `/latest/meta-data/iam/security-credentials/${ROLE}/`,
      `/latest/meta-data/iam/security-credentials/team/${ROLE}`,
      '/latest/meta-data/../meta-data/iam/info',
      '/latest/meta-data/instance-id',
      '/latest/meta-data/placement/region',
      '/latest/meta-data/',
      '/latest/user-data',
      '/latest/meta-data/iam/security-credentials/',
    ),
  );
  const method = fc.oneof(
    fc.constantFrom(
      'GET',
      'HEAD',
      'PUT',
      'POST',
      'DELETE',
      'OPTIONS',
      'PATCH',
      'TRACE',
      'CONNECT',
      'get',
      'PRI',
      'M-SEARCH',
    ),
    fc.stringMatching(/^[A-Z]{1,10}$/),
  );
  const header = fc.oneof(
    fc.constantFrom(
      'X-Forwarded-For: 10.0.0.1',
      'X-Forwarded-For:',
      'X-Forwarded-For: 10.0.0.1, 10.0.0.2',
      'x-forwarded-for: 127.0.0.1',
      'Forwarded: for=10.0.0.1',
      'X-Real-IP: 10.0.0.1',
      'X-aws-ec2-metadata-token-ttl-seconds: 21600',
      'X-aws-ec2-metadata-token-ttl-seconds: 0',
      'X-aws-ec2-metadata-token-ttl-seconds: 21601',
      'X-aws-ec2-metadata-token-ttl-seconds: -5',
      'X-aws-ec2-metadata-token-ttl-seconds: 1e3',
      'X-aws-ec2-metadata-token-ttl-seconds: ',
      'X-aws-ec2-metadata-token-ttl-seconds: 99999999999999999999',
      'X-aws-ec2-metadata-token: ',
      'X-aws-ec2-metadata-token: 9999999999.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA',
      `X-aws-ec2-metadata-token: ${'t'.repeat(10_000)}`,
      `X-aws-ec2-metadata-token: ${'t'.repeat(20_000)}`,
      'Transfer-Encoding: chunked',
      'Content-Length: 5',
      'Content-Length: -1',
      'Expect: 100-continue',
      'Upgrade: websocket',
      'Host: evil.example',
      'Connection: keep-alive',
    ),
    fc
      .tuple(fc.stringMatching(/^[A-Za-z-]{1,20}$/), fc.string({ maxLength: 40 }))
      .map(([name, value]) => `${name}: ${value}`),
  );
  const hostileRequest = fc
    .record({
      method,
      path,
      version: fc.constantFrom('HTTP/1.1', 'HTTP/1.0', 'HTTP/2.0', 'HTTP/1.1 x', ''),
      headers: fc.array(header, { maxLength: 6 }),
      body: fc.oneof(fc.constant(''), fc.string({ maxLength: 64 }), fc.constant('x'.repeat(70_000))),
    })
    .map(
      ({ method: m, path: p, version, headers, body }) =>
        `${m} ${p} ${version}\r\nHost: 169.254.169.254\r\n${headers.map((h) => `${h}\r\n`).join('')}Connection: close\r\n\r\n${body}`,
    );

  const checkAnswer = (request: string, response: RawResponse) => {
    const requestLine = request.split('\r\n')[0] ?? '';
    if (response.status === undefined) {
      assert.fail(
        `no HTTP answer to ${JSON.stringify(requestLine.slice(0, 200))}: ${JSON.stringify(response.head.slice(0, 200))}`,
      );
    }
    assert.ok(
      response.status === 200 || (response.status >= 400 && response.status < 500),
      `status ${response.status} for ${JSON.stringify(requestLine.slice(0, 200))}`,
    );
    if (response.status >= 400)
      assert.ok(
        response.body.length > 0 || requestLine.startsWith('HEAD '),
        `a ${response.status} without a reason for ${JSON.stringify(requestLine.slice(0, 200))}`,
      );
    if (response.body.includes('AccessKeyId')) {
      const target = requestLine.split(' ')[1]?.split('?')[0] ?? '';
      assert.ok(CREDENTIAL_PATHS.has(target), `credentials answered to ${JSON.stringify(requestLine.slice(0, 200))}`);
    }
  };

  const fuzz = async (runs: number, seed: number): Promise<number> => {
    let sent = 0;
    const samples = fc.sample(hostileRequest, { numRuns: runs, seed });
    const worker = async () => {
      for (let request = samples.pop(); request !== undefined; request = samples.pop()) {
        checkAnswer(request, await raw(request));
        sent++;
      }
    };
    await Promise.all(Array.from({ length: 8 }, worker));
    return sent;
  };

  const heapAfterGc = (): number => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    gc();
    gc();
    return process.memoryUsage().heapUsed;
  };

  // ---- the tests --------------------------------------------------------------------------------------

  it('answers every fuzzed request with 200 or a 4xx with a reason, never credentials for another role, and stays within bounded memory', async () => {
    const seed = Number(process.env.FUZZ_SEED ?? Date.now() % 2 ** 31);
    console.log(`imds fuzz seed ${seed} (rerun with FUZZ_SEED=${seed})`);
    await fuzz(300, seed);
    const heapBefore = heapAfterGc();
    const sent = await fuzz(1_500, seed + 1);
    const heapAfter = heapAfterGc();
    const growthMb = (heapAfter - heapBefore) / 2 ** 20;
    console.log(
      `imds fuzz: ${sent} hostile requests after warm-up; heap ${(heapBefore / 2 ** 20).toFixed(1)} MB → ${(heapAfter / 2 ** 20).toFixed(1)} MB (${growthMb >= 0 ? '+' : ''}${growthMb.toFixed(1)} MB)`,
    );
    assert.ok(growthMb < 24, `heap grew by ${growthMb.toFixed(1)} MB over ${sent} requests`);
    for (const event of harness.events) {
      if (event.type === 'credential.issued') assert.equal(event.roleArn, `${BASE_ROLE_ARN}${ROLE}`);
    }
    assert.deepEqual(crashes, [], 'no unhandled rejection or exception');
  });

  it('forwarded nothing upstream beyond the allow-list: no credential path, no pod token, no X-Forwarded-For', () => {
    assert.ok(upstream.requests.length > 0, 'the fuzzer reached the upstream through allow-listed paths');
    for (const request of upstream.requests) {
      const agentsOwnToken = request.method === 'PUT' && request.url === '/latest/api/token';
      assert.ok(
        agentsOwnToken || (request.method === 'GET' && ALLOW.test(request.url)),
        `${request.method} ${request.url} reached the upstream`,
      );
      assert.doesNotMatch(request.url, /iam|identity-credentials/);
      assert.equal(request.headers['x-forwarded-for'], undefined);
      const token = request.headers['x-aws-ec2-metadata-token'];
      assert.ok(
        token === undefined || token === 'upstream-token',
        `a pod's token reached the upstream: ${String(token).slice(0, 40)}`,
      );
    }
  });

  it('serves the pod normally afterwards', async () => {
    const response = await get(`/latest/meta-data/iam/security-credentials/${ROLE}`);
    assert.equal(response.status, 200);
    assert.match(response.body, /"AccessKeyId"/);
  });

  it('refuses role names with slashes, encoded or dot-segment paths to another role, and huge tokens, each with a reason', async () => {
    const cases: Array<[string, string[], number]> = [
      [`/latest/meta-data/iam/security-credentials/team/${ROLE}`, [], 404],
      ['/latest/meta-data/iam/security-credentials/other-role', [], 404],
      [`/latest/meta-data/iam/security-credentials/%66uzz-role`, [], 400],
      [`/latest/meta-data/iam/security-credentials/../security-credentials/${ROLE}`, [], 400],
      [`/latest/meta-data/iam/security-credentials/${'r'.repeat(600)}`, [], 400],
      ['/latest/meta-data/iam/security-credentials/', [`X-aws-ec2-metadata-token: ${'t'.repeat(10_000)}`], 401],
      ['/latest/meta-data/iam/security-credentials/', [`X-aws-ec2-metadata-token: ${'t'.repeat(20_000)}`], 431],
      [
        '/latest/meta-data/iam/security-credentials/',
        ['X-aws-ec2-metadata-token: a', 'X-aws-ec2-metadata-token: b'],
        401,
      ],
    ];
    for (const [target, headers, status] of cases) {
      const response = await get(target, headers);
      assert.equal(response.status, status, `${target.slice(0, 80)} ${headers.map((h) => h.slice(0, 40)).join(',')}`);
      assert.ok(response.body.length > 0, 'with a reason');
    }
    const put = (headers: string[]) =>
      raw(
        `PUT /latest/api/token HTTP/1.1\r\nHost: x\r\n${headers.map((h) => `${h}\r\n`).join('')}Connection: close\r\n\r\n`,
      );
    assert.equal(
      (await put(['X-aws-ec2-metadata-token-ttl-seconds: 60', 'X-aws-ec2-metadata-token-ttl-seconds: 60'])).status,
      400,
      'duplicate TTL',
    );
    assert.equal((await put(['X-aws-ec2-metadata-token-ttl-seconds: 1e3'])).status, 400);
    assert.equal((await put(['X-aws-ec2-metadata-token-ttl-seconds: 60', 'X-Forwarded-For: 10.0.0.1'])).status, 403);
    assert.equal(
      (await put(['X-aws-ec2-metadata-token-ttl-seconds: 60', 'x-forwarded-for:'])).status,
      403,
      'even an empty X-Forwarded-For',
    );
    const connectAnswer = await raw('CONNECT 169.254.169.254:80 HTTP/1.1\r\nHost: x\r\n\r\n');
    assert.equal(connectAnswer.status, 405);
  });

  it('a client that goes away while its lookup waits ends that lookup at once: no waiter, no answer', async () => {
    const sockets = await Promise.all(
      Array.from(
        { length: 50 },
        () =>
          new Promise<Socket>((resolve) => {
            const socket = connect({ host: harness.network.nodeIp, port: port(), localAddress: STRANGER_IP }, () => {
              socket.write('GET /latest/meta-data/iam/security-credentials/ HTTP/1.1\r\nHost: x\r\n\r\n');
              resolve(socket);
            });
            socket.on('error', () => undefined);
          }),
      ),
    );
    await eventually('the lookup waits', () => harness.agent.index.waitingKeys() === 1);
    const closed = sockets.map((socket) => new Promise((resolve) => socket.once('close', resolve)));
    for (const socket of sockets) socket.destroy();
    await Promise.all(closed);
    // Well inside the grace window: only the clients going away can have ended these lookups.
    await eventually('the aborted lookup is gone', () => harness.agent.index.waitingKeys() === 0, GRACE_WINDOW_MS / 2);
    assert.deepEqual(
      harness.events.filter((event) => event.podIp === STRANGER_IP),
      [],
      'no answer was decided for them',
    );
    assert.deepEqual(crashes, []);
  });

  it("closes slow-loris sockets (headers dribbled, or nothing sent) with the server's timeouts", async () => {
    const dribble = new Promise<RawResponse>((resolve) => {
      const started = performance.now();
      const chunks: Buffer[] = [];
      let timer: NodeJS.Timeout | undefined;
      const socket = connect({ host: harness.network.nodeIp, port: port(), localAddress: POD_IP }, () => {
        socket.write('GET /latest/meta-data/iam/security-credentials/ HTTP/1.1\r\nHost: x\r\nX-Slow: ');
        timer = setInterval(() => socket.write('a'), 200);
      });
      const bound = setTimeout(() => socket.destroy(), 30_000);
      socket.on('data', (chunk) => chunks.push(chunk));
      socket.on('error', () => undefined);
      socket.on('close', () => {
        clearInterval(timer);
        clearTimeout(bound);
        resolve({
          status: Number(/^HTTP\/1\.1 (\d{3})/.exec(Buffer.concat(chunks).toString())?.[1]) || undefined,
          head: '',
          body: '',
          closedAfterMs: performance.now() - started,
        });
      });
    });
    const silent = raw('', { boundMs: 30_000 });
    const [dribbled, idle] = await Promise.all([dribble, silent]);
    console.log(
      `slow-loris: dribbling client closed after ${Math.round(dribbled.closedAfterMs)} ms (status ${dribbled.status}), silent client after ${Math.round(idle.closedAfterMs)} ms (status ${idle.status})`,
    );
    assert.ok(dribbled.closedAfterMs < 29_000, "the server closed the dribbling socket, not the test's bound");
    assert.ok(idle.closedAfterMs < 29_000, 'the server closed the silent socket');
    assert.equal(dribbled.status, 408);
  });
});
