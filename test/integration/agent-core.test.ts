/**
 * The core path end to end: the real informer against the wire-level API server, STS from moto,
 * and real SDK clients (awscli, boto3, the JS SDK) running as pods with their own IPs.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ACCOUNT, AgentHarness, BASE_ROLE_ARN, imdsGet } from '../fixtures/agent.js';
import { awscliCallerIdentity, boto3Credentials, jsSdkCredentials } from '../fixtures/clients.js';
import type { NetnsPod } from '../fixtures/netns.js';

const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';
const assumedRole = (role: string, namespace: string, pod: string) =>
  `arn:aws:sts::${ACCOUNT}:assumed-role/${role}/${namespace}@${pod}`;

describe('agent core: pods get their annotated role', () => {
  let harness: AgentHarness;
  let reader: NetnsPod;
  let writer: NetnsPod;
  let stranger: NetnsPod;

  before(async () => {
    harness = await AgentHarness.create();
    [reader, writer, stranger] = await Promise.all([
      harness.addNetnsPod('reader'),
      harness.addNetnsPod('writer'),
      harness.addNetnsPod('stranger'),
    ]);
    harness.api.upsertNamespace({ metadata: { name: 'shop' } });
    harness.schedulePod({ name: 'reader', namespace: 'shop', role: 'app-reader', ip: reader.ip });
    harness.schedulePod({
      name: 'writer',
      namespace: 'shop',
      role: `arn:aws:iam::${ACCOUNT}:role/team/app-writer`,
      ip: writer.ip,
    });
    await harness.startAgent();
    await harness.waitUntilReady();
  });
  after(() => harness?.stop());

  it("awscli in a pod calls STS as the pod's annotated role (a bare name joined to the base ARN)", async () => {
    const result = await awscliCallerIdentity(reader, harness.imdsEndpoint, harness.moto.endpoint);
    assert.ok(result.ok, result.error);
    assert.equal(result.arn, assumedRole('app-reader', 'shop', 'reader'));
  });

  it("boto3 in another pod gets that pod's role (a full ARN with a path), never the first pod's", async () => {
    const result = await boto3Credentials(writer, harness.imdsEndpoint, harness.moto.endpoint);
    assert.ok(result.ok, result.error);
    assert.equal(result.arn, assumedRole('app-writer', 'shop', 'writer'));
    const expiresInMs = Date.parse(result.expiration ?? '') - Date.now();
    assert.ok(
      expiresInMs > 25 * 60_000,
      `credentials must have more than 25 minutes left, had ${Math.round(expiresInMs / 60_000)} min`,
    );
  });

  it("the JS SDK's fromInstanceMetadata gets the pod's role, and its second call makes no new STS call", async () => {
    const first = await jsSdkCredentials(reader, harness.imdsEndpoint, harness.moto.endpoint);
    assert.ok(first.ok, first.error);
    assert.equal(first.arn, assumedRole('app-reader', 'shop', 'reader'));
    const second = await jsSdkCredentials(reader, harness.imdsEndpoint, harness.moto.endpoint);
    assert.equal(second.accessKeyId, first.accessKeyId, 'the same cached credentials');
  });

  it('answers the role name alone, with or without the trailing slash', async () => {
    for (const path of [CREDENTIALS, CREDENTIALS.slice(0, -1)]) {
      const response = await imdsGet(reader, `${harness.imdsEndpoint}${path}`);
      assert.equal(response.status, 200);
      assert.equal(response.body, 'app-reader');
    }
  });

  it("serves the credential document in EC2's exact format, also on the extended path", async () => {
    const legacy = await imdsGet(reader, `${harness.imdsEndpoint}${CREDENTIALS}app-reader`);
    assert.equal(legacy.status, 200);
    const document = JSON.parse(legacy.body);
    assert.deepEqual(Object.keys(document), [
      'Code',
      'LastUpdated',
      'Type',
      'AccessKeyId',
      'SecretAccessKey',
      'Token',
      'Expiration',
    ]);
    assert.equal(document.Code, 'Success');
    assert.match(document.Expiration, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    assert.match(legacy.headers, /Server: EC2ws/);
    const extended = await imdsGet(
      reader,
      `${harness.imdsEndpoint}/latest/meta-data/iam/security-credentials-extended/app-reader`,
    );
    assert.equal(JSON.parse(extended.body).AccountId, ACCOUNT);
  });

  it('never gives a pod credentials for a role that is not its own', async () => {
    const response = await imdsGet(reader, `${harness.imdsEndpoint}${CREDENTIALS}app-writer`);
    assert.equal(response.status, 404);
    assert.doesNotMatch(response.body, /AccessKeyId/);
    const denied = await harness.nextEvent(
      (event) => event.type === 'credential.denied' && event.requestedRole === 'app-writer',
    );
    assert.equal(denied.pod, 'reader');
  });

  it("describes the pod's role, not the node's, in iam/info", async () => {
    const response = await imdsGet(writer, `${harness.imdsEndpoint}/latest/meta-data/iam/info`);
    assert.equal(response.status, 200);
    assert.equal(
      JSON.parse(response.body).InstanceProfileArn,
      `arn:aws:iam::${ACCOUNT}:instance-profile/team/app-writer`,
    );
  });

  it('answers a retryable 503 that says why to a caller with no pod once its wait ends', async () => {
    const started = Date.now();
    const response = await imdsGet(stranger, `${harness.imdsEndpoint}${CREDENTIALS}`);
    assert.equal(response.status, 503);
    assert.ok(Date.now() - started >= 300, 'held for the wait of an unrecognised client (curl)');
    assert.match(response.body, /^no pod on this node has IP \S+ after waiting \d+ ms; retry$/);
  });

  it('answers 404 for a known pod without a role annotation', async () => {
    harness.schedulePod({ name: 'stranger', ip: stranger.ip });
    await harness.nextEvent((event) => event.type === 'pod.indexed' && event.pod === 'stranger');
    const response = await imdsGet(stranger, `${harness.imdsEndpoint}${CREDENTIALS}`);
    assert.equal(response.status, 404);
  });

  it('logs one line per decision with pod, role and wait, and never a secret', async () => {
    const credentials = JSON.parse((await imdsGet(reader, `${harness.imdsEndpoint}${CREDENTIALS}app-reader`)).body);
    await harness.nextEvent((event) => event.type === 'credential.issued');
    const issued = harness.logs.map((line) => JSON.parse(line)).filter((line) => line.event === 'credential.issued');
    assert.ok(issued.length > 0);
    assert.deepEqual(
      {
        pod: issued.at(-1).pod,
        namespace: issued.at(-1).namespace,
        roleArn: issued.at(-1).roleArn,
        source: issued.at(-1).source,
      },
      { pod: 'reader', namespace: 'shop', roleArn: `${BASE_ROLE_ARN}app-reader`, source: 'annotation' },
    );
    assert.equal(typeof issued.at(-1).waitedMs, 'number');
    const allLogs = harness.logs.join('\n');
    assert.ok(
      !allLogs.includes(credentials.SecretAccessKey) && !allLogs.includes(credentials.Token),
      'no secret in the logs',
    );
  });
});
