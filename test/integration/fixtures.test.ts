// Proves the test fixtures themselves: fake pods with their own source IPs, moto as STS, and the
// three real SDK clients fetching credentials from an IMDS endpoint within their default limits.
// Run: bash test/hermetic.sh npx tsx --test test/integration/fixtures.test.ts
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { AssumeRoleCommand, GetCallerIdentityCommand, STSClient } from '@aws-sdk/client-sts';
import {
  awscliCallerIdentity,
  boto3Credentials,
  curlInPod,
  jsSdkCredentials,
  type ClientResult,
} from '../fixtures/clients.js';
import { Moto, motoClientConfig } from '../../testkit/moto.js';
import { PodNetwork, type NetnsPod } from '../fixtures/netns.js';

const SETUP_TIMEOUT_MS = 30_000;
const TEST_TIMEOUT_MS = 30_000;
const ROLE_NAME = 'test-role';
const ROLE_ARN = `arn:aws:iam::123456789012:role/${ROLE_NAME}`;
const ASSUMED_ROLE_ARN = /^arn:aws:sts::123456789012:assumed-role\/test-role\/.+/;
/** Well past the 1 s that botocore and the JS SDK wait for a metadata response by default. */
const HOLD_PAST_CLIENT_TIMEOUT_MS = 2_500;

interface SeenRequest {
  from: string | undefined;
  method: string | undefined;
  path: string | undefined;
}

interface Issued {
  accessKeyId: string;
  expiration: Date;
  arn: string;
}

/** Just enough IMDS for the SDKs, handing out credentials that moto's STS really issued. */
class StandInImds {
  readonly requests: SeenRequest[] = [];
  lastIssued: Issued | undefined;
  /** How long a credentials GET is held before it is answered. */
  holdCredentialsMs = 0;
  private issuedCount = 0;
  readonly endpoint: string;

  private constructor(
    private readonly server: Server,
    private readonly sts: STSClient,
  ) {
    const { address, port } = server.address() as AddressInfo;
    this.endpoint = `http://${address}:${port}`;
  }

  static async start(host: string, sts: STSClient): Promise<StandInImds> {
    const server = createServer();
    server.listen(0, host);
    await once(server, 'listening');
    const imds = new StandInImds(server, sts);
    server.on('request', (req, res) => {
      imds.answer(req, res).catch((err: Error) => res.writeHead(500).end(err.message));
    });
    return imds;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    this.server.close();
    await once(this.server, 'close');
  }

  private async answer(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // The point of the exercise: which pod is asking, as the agent will see it.
    this.requests.push({ from: req.socket.remoteAddress, method: req.method, path: req.url });
    const route = `${req.method} ${req.url}`;
    if (route === 'PUT /latest/api/token') return answerToken(req, res);
    if (route === 'GET /latest/meta-data/iam/security-credentials/') return void res.end(ROLE_NAME);
    if (route === `GET /latest/meta-data/iam/security-credentials/${ROLE_NAME}`) {
      await sleep(this.holdCredentialsMs);
      return void res.end(JSON.stringify(await this.issueCredentials()));
    }
    res.writeHead(404).end();
  }

  private async issueCredentials() {
    // A session name per issue, so the ARN a client reports names the very credentials it got.
    const sessionName = `stand-in-${++this.issuedCount}`;
    const { Credentials: credentials, AssumedRoleUser: user } = await this.sts.send(
      new AssumeRoleCommand({ RoleArn: ROLE_ARN, RoleSessionName: sessionName, DurationSeconds: 3600 }),
    );
    assert.ok(credentials?.Expiration && user?.Arn, 'moto AssumeRole answered without credentials');
    this.lastIssued = { accessKeyId: credentials.AccessKeyId!, expiration: credentials.Expiration, arn: user.Arn };
    return {
      Code: 'Success',
      LastUpdated: imdsTime(new Date()),
      Type: 'AWS-HMAC',
      AccessKeyId: credentials.AccessKeyId,
      SecretAccessKey: credentials.SecretAccessKey,
      Token: credentials.SessionToken,
      Expiration: imdsTime(credentials.Expiration),
    };
  }
}

function answerToken(req: IncomingMessage, res: ServerResponse): void {
  const ttl = req.headers['x-aws-ec2-metadata-token-ttl-seconds'];
  if (typeof ttl !== 'string' || !/^\d+$/.test(ttl)) return void res.writeHead(400).end();
  // Several SDKs cannot read a token whose TTL is not echoed.
  res.writeHead(200, { 'X-Aws-Ec2-Metadata-Token-Ttl-Seconds': ttl }).end('stand-in-token');
}

/** IMDS timestamps carry no fractional seconds: botocore parses exactly YYYY-MM-DDTHH:MM:SSZ. */
function imdsTime(date: Date): string {
  return date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

let network: PodNetwork | undefined;
let moto: Moto | undefined;
let imds: StandInImds | undefined;
let sts: STSClient | undefined;
let podA: NetnsPod;
let podB: NetnsPod;

before(
  async () => {
    network = await PodNetwork.create(); // refuses to run outside test/hermetic.sh
    [podA, podB] = await Promise.all([network.addPod('a'), network.addPod('b')]);
    moto = await Moto.start(network.nodeIp);
    sts = new STSClient(motoClientConfig(moto.endpoint));
    imds = await StandInImds.start(network.nodeIp, sts);
  },
  { timeout: SETUP_TIMEOUT_MS },
);

after(
  async () => {
    sts?.destroy();
    await Promise.all([imds?.close(), moto?.stop(), network?.destroy()]);
  },
  { timeout: SETUP_TIMEOUT_MS },
);

const clients = [
  { name: 'awscli', fetch: awscliCallerIdentity, reportsCredentials: false },
  { name: 'boto3', fetch: boto3Credentials, reportsCredentials: true },
  { name: 'JS SDK v3', fetch: jsSdkCredentials, reportsCredentials: true },
];

for (const client of clients) {
  test(`${client.name} in pod A gets the role's credentials from IMDS`, { timeout: TEST_TIMEOUT_MS }, async (t) => {
    imds!.requests.length = 0;
    const started = performance.now();
    const result: ClientResult = await client.fetch(podA, imds!.endpoint, moto!.endpoint);
    t.diagnostic(`${client.name} took ${Math.round(performance.now() - started)} ms`);

    assert.ok(result.ok, `${client.name} failed: ${result.error}\n${result.raw.stderr}`);
    assert.match(result.arn ?? '', ASSUMED_ROLE_ARN);
    const issued = imds!.lastIssued!;
    assert.equal(result.arn, issued.arn);
    if (client.reportsCredentials) {
      assert.equal(result.accessKeyId, issued.accessKeyId);
      assert.equal(Date.parse(result.expiration ?? ''), Date.parse(imdsTime(issued.expiration)));
    }
    assert.ok(imds!.requests.length > 0);
    assert.deepEqual(new Set(imds!.requests.map((r) => r.from)), new Set([podA.ip]));
  });
}

// Guards the fixtures' promise that the clients keep their SDKs' default (short) metadata timeouts.
for (const client of clients) {
  test(
    `${client.name} gives up on credentials held past its default timeout`,
    { timeout: TEST_TIMEOUT_MS },
    async () => {
      imds!.holdCredentialsMs = HOLD_PAST_CLIENT_TIMEOUT_MS;
      try {
        const result = await client.fetch(podA, imds!.endpoint, moto!.endpoint);
        assert.equal(result.ok, false, `${client.name} waited ${HOLD_PAST_CLIENT_TIMEOUT_MS} ms for credentials`);
      } finally {
        imds!.holdCredentialsMs = 0;
      }
    },
  );
}

test('pod B reaches the node from its own address', { timeout: TEST_TIMEOUT_MS }, async () => {
  imds!.requests.length = 0;
  const tokenUrl = `${imds!.endpoint}/latest/api/token`;
  const raw = await curlInPod(podB, ['-X', 'PUT', '-H', 'X-aws-ec2-metadata-token-ttl-seconds: 21600', tokenUrl]);

  assert.equal(raw.code, 0, raw.stderr);
  assert.equal(raw.stdout, 'stand-in-token');
  assert.notEqual(podB.ip, podA.ip);
  assert.deepEqual(imds!.requests, [{ from: podB.ip, method: 'PUT', path: '/latest/api/token' }]);
});

test('moto fails every call while failAuth is on', { timeout: TEST_TIMEOUT_MS }, async () => {
  await moto!.failAuth(true);
  try {
    await assert.rejects(sts!.send(new GetCallerIdentityCommand({})), { name: 'InvalidClientTokenId' });
  } finally {
    await moto!.failAuth(false);
  }
  await sts!.send(new GetCallerIdentityCommand({}));
});
