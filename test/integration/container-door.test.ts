/**
 * The container-credentials door end to end: the agent brings 169.254.170.23 up on its dummy link,
 * real SDK clients in network-namespace pods present projected tokens the fake API server signed
 * (RS256, the kubelet's claims), and the agent proves them with a TokenReview and its own index.
 * The metadata service is disabled in every client, so each answer came through this door.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ACCOUNT, AgentHarness, imdsGet } from '../fixtures/agent.js';
import { awscliCallerIdentity, boto3ChainCredentials, jsSdkChainCredentials } from '../fixtures/clients.js';
import type { NetnsPod } from '../fixtures/netns.js';
import { eventually } from '../../testkit/eventually.js';

const DOOR = 'http://169.254.170.23/v1/credentials';
const AUDIENCE = 'kube-iam-broker';
const assumedRole = (role: string, namespace: string, pod: string) =>
  `arn:aws:sts::${ACCOUNT}:assumed-role/${role}/${namespace}@${pod}`;

describe('container-credentials door: pods proven by their service-account token', () => {
  let harness: AgentHarness;
  let tokenDir: string;
  let alice: NetnsPod;
  let bob: NetnsPod;
  let shared: NetnsPod;

  const tokenFor = (
    pod: string,
    request: Parameters<AgentHarness['api']['issueToken']>[2] = { audiences: [AUDIENCE] },
  ) => harness.api.issueToken('shop', pod, request);
  const writeToken = async (name: string, token: string) => {
    const file = join(tokenDir, name);
    await writeFile(file, token);
    return { containerUri: DOOR, tokenFile: file };
  };
  const tokenReviews = () =>
    harness.api.requests.filter((request) => request.method === 'POST' && request.path.endsWith('/tokenreviews'))
      .length;
  const ask = (
    pod: NetnsPod,
    authorization: string,
    headers: Record<string, string> = {},
    method = 'GET',
    url = DOOR,
  ) => imdsGet(pod, url, { Authorization: authorization, ...headers }, method);

  before(async () => {
    harness = await AgentHarness.create();
    tokenDir = await mkdtemp(join(tmpdir(), 'kib-tokens-'));
    [alice, bob, shared] = await Promise.all([
      harness.addNetnsPod('alice'),
      harness.addNetnsPod('bob'),
      harness.addNetnsPod('shared'),
    ]);
    harness.api.upsertNamespace({ metadata: { name: 'shop' } });
    harness.api.upsertServiceAccount({
      metadata: {
        name: 'reports',
        namespace: 'shop',
        annotations: { 'iam.amazonaws.com/role': 'app-reports', unrelated: 'x'.repeat(1000) },
      },
    });
    harness.schedulePod({ name: 'alice', namespace: 'shop', role: 'app-alice', ip: alice.ip });
    harness.schedulePod({ name: 'bob', namespace: 'shop', serviceAccount: 'reports', ip: bob.ip });
    harness.schedulePod({
      name: 'elsewhere',
      namespace: 'shop',
      role: 'app-alice',
      nodeName: 'node-b',
      ip: '10.99.0.7',
    });
    // This machine's kernel has no dummy link type (no module to load inside the test namespace):
    // the agent puts the address on an existing link instead, which takes the same path in src/container/link.ts.
    await harness.startAgent({ BROKER_CONTAINER_LISTEN: '169.254.170.23:80', BROKER_CONTAINER_LINK: 'lo' });
    await harness.waitUntilReady();
  });
  after(async () => {
    await harness?.stop();
    await rm(tokenDir, { recursive: true, force: true });
  });

  it("awscli in a pod gets the pod's annotated role from the door, with the metadata service disabled", async () => {
    const result = await awscliCallerIdentity(
      alice,
      await writeToken('alice', tokenFor('alice')),
      harness.moto.endpoint,
    );
    assert.ok(result.ok, result.error);
    assert.equal(result.arn, assumedRole('app-alice', 'shop', 'alice'));
    const issued = await harness.nextEvent(
      (event) => event.type === 'credential.issued' && event.door === 'container' && event.pod === 'alice',
    );
    assert.equal(issued.type === 'credential.issued' && issued.source, 'annotation');
  });

  it("the JS SDK v3 default chain gets the role of the pod's ServiceAccount when the pod names none", async () => {
    const result = await jsSdkChainCredentials(bob, await writeToken('bob', tokenFor('bob')), harness.moto.endpoint);
    assert.ok(result.ok, result.error);
    assert.equal(result.arn, assumedRole('app-reports', 'shop', 'bob'));
    const issued = await harness.nextEvent(
      (event) => event.type === 'credential.issued' && event.door === 'container' && event.pod === 'bob',
    );
    assert.deepEqual(
      issued.type === 'credential.issued' && { source: issued.source, serviceAccount: issued.serviceAccount },
      { source: 'service-account', serviceAccount: 'reports' },
    );
  });

  it('the metadata door applies the same ServiceAccount role, with the same session and so the same credentials', async () => {
    const viaMetadata = JSON.parse(
      (await imdsGet(bob, `${harness.imdsEndpoint}/latest/meta-data/iam/security-credentials/app-reports`)).body,
    );
    const viaDoor = JSON.parse((await ask(bob, tokenFor('bob'))).body);
    assert.equal(viaDoor.AccessKeyId, viaMetadata.AccessKeyId);
    assert.deepEqual(Object.keys(viaDoor), ['AccessKeyId', 'SecretAccessKey', 'Token', 'Expiration', 'AccountId']);
    assert.match(viaDoor.Expiration, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    assert.equal(viaDoor.AccountId, ACCOUNT);
  });

  it('boto3 reads the rotated token file: the new token is reviewed once and then served from the cache', async () => {
    const source = await writeToken('alice-rotating', tokenFor('alice'));
    assert.ok((await boto3ChainCredentials(alice, source, harness.moto.endpoint)).ok);
    const before = tokenReviews();
    await writeFile(source.tokenFile, tokenFor('alice')); // what the kubelet does at 80% of the token's life
    const result = await boto3ChainCredentials(alice, source, harness.moto.endpoint);
    assert.ok(result.ok, result.error);
    assert.equal(result.arn, assumedRole('app-alice', 'shop', 'alice'));
    assert.equal(tokenReviews(), before + 1, 'the new token was reviewed');
    assert.equal((await ask(alice, tokenFor('alice'))).status, 200);
    const token = tokenFor('alice');
    await ask(alice, token);
    const reviewed = tokenReviews();
    assert.equal((await ask(alice, token)).status, 200);
    assert.equal(tokenReviews(), reviewed, 'a token already reviewed costs no API call');
  });

  it("refuses a deleted pod's still-valid token, also when its review was cached", async () => {
    harness.schedulePod({ name: 'leaving', namespace: 'shop', role: 'app-alice' });
    await harness.nextEvent((event) => event.type === 'pod.indexed' && event.pod === 'leaving').catch(() => undefined);
    const token = tokenFor('leaving');
    await eventually('the leaving pod is served', async () => (await ask(shared, token)).status === 200, 5_000);
    harness.api.deletePod('shop', 'leaving');
    await eventually('the deleted pod is refused', async () => (await ask(shared, token)).status === 403, 5_000);
    const refused = JSON.parse((await ask(shared, token)).body);
    assert.equal(refused.Code, 'AccessDenied');
    // The agent dropped the cached review with the pod, so the API server was asked again and refused too.
    assert.match(refused.Message, /not a live pod on this node|pod "leaving" not found/);
  });

  it('refuses a token of a pod on another node, and says so', async () => {
    const response = await ask(shared, tokenFor('elsewhere'));
    assert.equal(response.status, 403);
    assert.match(JSON.parse(response.body).Message, /node node-b, not this node \(node-a\)/);
  });

  it('refuses a token of another audience, an expired one and garbage without asking the API server', async () => {
    const before = tokenReviews();
    const otherAudience = await ask(alice, tokenFor('alice', { audiences: ['sts.amazonaws.com'] }));
    assert.equal(otherAudience.status, 403);
    assert.match(JSON.parse(otherAudience.body).Message, /not for audience kube-iam-broker/);
    const expired = await ask(
      alice,
      tokenFor('alice', { audiences: [AUDIENCE], expirationSeconds: 600, issuedSecondsAgo: 700 }),
    );
    assert.equal(expired.status, 403);
    assert.match(JSON.parse(expired.body).Message, /expired/);
    for (const garbage of [
      'x'.repeat(9_000),
      'Bearer abc.def.ghi',
      'not-a-jwt',
      `${'a'.repeat(20)}.${Buffer.from('{"aud":').toString('base64url')}.sig`,
    ]) {
      const response = await ask(alice, garbage);
      assert.equal(response.status, 400, garbage.slice(0, 30));
      assert.equal(JSON.parse(response.body).Code, 'InvalidToken');
    }
    const missing = await imdsGet(alice, DOOR);
    assert.equal(missing.status, 400);
    assert.equal(tokenReviews(), before, 'no TokenReview for any of them');
  });

  it('answers a flood of distinct bogus tokens and binary headers from a pod without one TokenReview', async () => {
    const before = tokenReviews();
    // One process in the pod sends them all: distinct expired tokens for our audience, other audiences, binary noise.
    const script = `
      const part = (v) => Buffer.from(JSON.stringify(v)).toString('base64url');
      const statuses = {};
      for (let i = 0; i < 300; i++) {
        const claims = i % 3 === 0 ? { aud: 'kube-iam-broker', exp: 1000 + i } : i % 3 === 1 ? { aud: 'other-' + i, exp: 4e9 } : null;
        const token = claims ? part({ alg: 'RS256' }) + '.' + part(claims) + '.sig' + i : Buffer.from([0x80 + (i % 128), 0xff, 0x80, 0xfe]).toString('latin1');
        const response = await fetch(${JSON.stringify(DOOR)}, { headers: { Authorization: token } }).catch((error) => ({ status: String(error.cause?.code ?? error) }));
        statuses[response.status] = (statuses[response.status] ?? 0) + 1;
      }
      console.log(JSON.stringify(statuses));`;
    const result = await alice.exec([process.execPath, '--input-type=module', '-e', script]);
    assert.equal(result.code, 0, result.stderr);
    const statuses = JSON.parse(result.stdout) as Record<string, number>;
    assert.equal(
      Object.values(statuses).reduce((sum, count) => sum + count, 0),
      300,
    );
    assert.ok(!('200' in statuses), `no credentials for a bogus token: ${result.stdout}`);
    assert.ok(
      Object.keys(statuses).every((status) => ['400', '403', '429'].includes(status)),
      result.stdout,
    );
    assert.equal(tokenReviews(), before, 'bogus tokens never reach the API server');
  });

  it('refuses a token signed by an unknown key after one review, and remembers the refusal', async () => {
    const forged = tokenFor('alice', { audiences: [AUDIENCE], foreignKey: true });
    const before = tokenReviews();
    const first = await ask(alice, forged);
    assert.equal(first.status, 403);
    assert.match(JSON.parse(first.body).Message, /did not authenticate the token: \[invalid bearer token/);
    assert.equal((await ask(alice, forged)).status, 403);
    assert.equal(tokenReviews(), before + 1, 'the refusal was cached');
  });

  it('gives a pod whose IP was taken over by a newer pod its own role here, where the metadata door must go by IP', async () => {
    harness.schedulePod({
      name: 'old',
      namespace: 'shop',
      role: 'app-old',
      ip: shared.ip,
      createdAt: new Date(Date.now() - 60_000),
    });
    harness.schedulePod({ name: 'new', namespace: 'shop', role: 'app-new', ip: shared.ip });
    await harness.nextEvent((event) => event.type === 'pod.indexed' && event.pod === 'new');
    const byIp = await imdsGet(shared, `${harness.imdsEndpoint}/latest/meta-data/iam/security-credentials/`);
    assert.equal(byIp.body, 'app-new');
    const result = await awscliCallerIdentity(shared, await writeToken('old', tokenFor('old')), harness.moto.endpoint);
    assert.ok(result.ok, result.error);
    assert.equal(result.arn, assumedRole('app-old', 'shop', 'old'));
  });

  it('answers only its own address, path and method, with JSON errors', async () => {
    const token = tokenFor('alice');
    const rebound = await ask(alice, token, { Host: 'attacker.example' });
    assert.equal(rebound.status, 403);
    assert.match(JSON.parse(rebound.body).Message, /not this endpoint's address/);
    const wrongPath = await ask(alice, token, {}, 'GET', 'http://169.254.170.23/v2/credentials');
    assert.equal(wrongPath.status, 404);
    assert.equal(JSON.parse(wrongPath.body).Code, 'NotFound');
    const wrongMethod = await ask(alice, token, {}, 'POST');
    assert.equal(wrongMethod.status, 405);
  });

  it("closes slow clients by the server's header timeout, and another pod's request meanwhile is answered at once", async () => {
    // Two slow-loris connections from one pod: one trickles its headers a byte every 300 ms, one
    // sends half a request line and goes silent. Each reports how long the server let it live.
    const slowClients = bob.exec(
      [
        'python3',
        '-c',
        `
import select, socket, threading, time
def slow(name, data, gap):
    s = socket.create_connection(('169.254.170.23', 80), timeout=15)
    start = time.monotonic()
    answer = b''
    try:
        for byte in data:
            s.sendall(bytes([byte]))
            if select.select([s], [], [], gap)[0]:
                break
        answer = s.recv(200)
        while s.recv(200):
            pass
    except OSError:
        answer = answer or b'reset'
    # One write per line under a lock: both connections can close in the same server sweep.
    with printing:
        print(name, round(time.monotonic() - start, 1), answer[:12].decode(errors='replace'), flush=True)
printing = threading.Lock()
trickle = b'GET /v1/credentials HTTP/1.1\\r\\nHost: 169.254.170.23\\r\\nAuthorization: ' + b'x' * 200
threads = [threading.Thread(target=slow, args=('trickle', trickle, 0.3)),
           threading.Thread(target=slow, args=('silent', b'GET /v1/cre', 0.01))]
for t in threads: t.start()
for t in threads: t.join()
`,
      ],
      { timeoutMs: 20_000 },
    );
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const meanwhile = await ask(alice, tokenFor('alice'));
    assert.equal(meanwhile.status, 200, 'a well-behaved pod is served while the slow clients hold their connections');
    const result = await slowClients;
    assert.equal(result.code, 0, result.stderr);
    const closed = new Map(
      result.stdout
        .trim()
        .split('\n')
        .map((line) => {
          const [name = '', seconds, ...answer] = line.split(' ');
          return [name, { seconds: Number(seconds), answer: answer.join(' ') }] as const;
        }),
    );
    for (const name of ['trickle', 'silent']) {
      const client = closed.get(name);
      assert.ok(client, `${name} reported: ${result.stdout}`);
      // headersTimeout is 5 s, swept every second: closed well before the client's own 15 s.
      assert.ok(client.seconds >= 4 && client.seconds <= 9, `${name} closed after ${client.seconds} s`);
      assert.match(client.answer, /^(HTTP\/1\.1 408|reset|)$/, `${name} got no credentials: ${client.answer}`);
    }
  });

  it('never logs a token or a secret', async () => {
    const token = tokenFor('alice');
    const credentials = JSON.parse((await ask(alice, token)).body);
    const logs = harness.logs.join('\n');
    assert.ok(!logs.includes(token.split('.')[2] as string), 'no token signature in the logs');
    assert.ok(!logs.includes(credentials.SecretAccessKey), 'no secret in the logs');
  });
});
