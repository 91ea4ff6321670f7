/**
 * The metadata protocol as SDKs and EC2 define it: IMDSv2 tokens (required mode here), the
 * pass-through allow-list, and which pods count as the owner of an IP.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentHarness, imdsGet } from '../fixtures/agent.js';
import { eventually } from '../../testkit/eventually.js';
import { type RecordingUpstream, startRecordingUpstream } from '../fixtures/upstream.js';
import { boto3Credentials } from '../fixtures/clients.js';
import type { NetnsPod } from '../fixtures/netns.js';

const TOKEN = '/latest/api/token';
const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';
const TTL = 'X-aws-ec2-metadata-token-ttl-seconds';

describe('metadata protocol', () => {
  let harness: AgentHarness;
  let upstream: RecordingUpstream;
  let app: NetnsPod;
  let other: NetnsPod;
  const url = (path: string) => `${harness.imdsEndpoint}${path}`;

  before(async () => {
    harness = await AgentHarness.create();
    upstream = await startRecordingUpstream();
    [app, other] = await Promise.all([harness.addNetnsPod('app'), harness.addNetnsPod('other')]);
    harness.schedulePod({ name: 'app', role: 'app-role', ip: app.ip });
    await harness.startAgent({
      BROKER_IMDS_TOKENS: 'required',
      BROKER_METADATA_UPSTREAM: upstream.url,
      BROKER_GRACE_WINDOW_MS: '100',
    });
    await harness.waitUntilReady();
  });
  after(async () => {
    await harness?.stop();
    await upstream?.stop();
  });

  async function token(pod: NetnsPod, ttl = '21600'): Promise<string> {
    const response = await imdsGet(pod, url(TOKEN), { [TTL]: ttl }, 'PUT');
    assert.equal(response.status, 200);
    return response.body;
  }

  describe('IMDSv2 tokens', () => {
    it('issues a token and echoes its TTL, which Go and Java SDKs need', async () => {
      const response = await imdsGet(app, url(TOKEN), { [TTL]: '300' }, 'PUT');
      assert.equal(response.status, 200);
      assert.match(response.headers, /X-Aws-Ec2-Metadata-Token-Ttl-Seconds: 300/i);
      assert.ok(response.body.length > 20);
    });

    it('answers 400 to a missing or out-of-range TTL', async () => {
      assert.equal((await imdsGet(app, url(TOKEN), {}, 'PUT')).status, 400);
      assert.equal((await imdsGet(app, url(TOKEN), { [TTL]: '0' }, 'PUT')).status, 400);
      assert.equal((await imdsGet(app, url(TOKEN), { [TTL]: '21601' }, 'PUT')).status, 400);
    });

    it('refuses token requests through a proxy (X-Forwarded-For) with 403, as EC2 does', async () => {
      assert.equal((await imdsGet(app, url(TOKEN), { [TTL]: '60', 'X-Forwarded-For': '10.0.0.1' }, 'PUT')).status, 403);
    });

    it('never holds the token PUT, even for a caller with no pod', async () => {
      const started = Date.now();
      assert.equal((await imdsGet(other, url(TOKEN), { [TTL]: '60' }, 'PUT')).status, 200);
      assert.ok(Date.now() - started < 100 + 2_000, 'answered without the grace window');
    });

    it("requires a valid token when tokens are required: 401 without, with a bad one, or with another pod's", async () => {
      assert.equal((await imdsGet(app, url(CREDENTIALS))).status, 401);
      assert.equal((await imdsGet(app, url(CREDENTIALS), { 'X-aws-ec2-metadata-token': 'forged' })).status, 401);
      const othersToken = await token(other);
      assert.equal((await imdsGet(app, url(CREDENTIALS), { 'X-aws-ec2-metadata-token': othersToken })).status, 401);
      const mine = await token(app);
      const response = await imdsGet(app, url(CREDENTIALS), { 'X-aws-ec2-metadata-token': mine });
      assert.equal(response.status, 200);
      assert.equal(response.body, 'app-role');
    });

    it('refuses a token-bearing request that came through a proxy', async () => {
      const mine = await token(app);
      assert.equal(
        (await imdsGet(app, url(CREDENTIALS), { 'X-aws-ec2-metadata-token': mine, 'X-Forwarded-For': '10.0.0.1' }))
          .status,
        403,
      );
    });

    it('still serves boto3, which uses tokens', async () => {
      const result = await boto3Credentials(app, harness.imdsEndpoint, harness.moto.endpoint);
      assert.ok(result.ok, result.error);
      assert.match(result.arn ?? '', /assumed-role\/app-role\/default@app$/);
    });
  });

  describe("pass-through to the node's metadata service", () => {
    it("proxies an allow-listed path with the agent's own upstream token, never the pod's or its X-Forwarded-For", async () => {
      const mine = await token(app);
      const response = await imdsGet(app, url('/latest/meta-data/instance-id'), { 'X-aws-ec2-metadata-token': mine });
      assert.equal(response.status, 200);
      assert.equal(response.body, 'i-0123456789abcdef0');
      const forwarded = upstream.requests.find((request) => request.url === '/latest/meta-data/instance-id');
      assert.equal(forwarded?.headers['x-aws-ec2-metadata-token'], 'upstream-token');
      assert.equal(forwarded?.headers['x-forwarded-for'], undefined);
    });

    it("never forwards user-data, the node's credentials or paths outside the allow-list", async () => {
      const mine = await token(app);
      for (const path of [
        '/latest/user-data',
        '/latest/meta-data/identity-credentials/ec2/security-credentials/ec2-instance',
        '/latest/dynamic/instance-identity/document',
        '/latest/meta-data/iam/security-credentials/app-role/extra',
      ]) {
        const response = await imdsGet(app, url(path), { 'X-aws-ec2-metadata-token': mine });
        assert.equal(response.status, 404, path);
        assert.ok(!upstream.requests.some((request) => request.url === path), `${path} was not forwarded`);
      }
    });

    it('rejects dot segments and encoded paths instead of interpreting them', async () => {
      const mine = await token(app);
      const response = await imdsGet(app, url('/latest/meta-data/placement/%2e%2e/iam/security-credentials/'), {
        'X-aws-ec2-metadata-token': mine,
      });
      assert.equal(response.status, 400);
    });
  });

  describe('which pod owns an IP', () => {
    const ask = async (pod: NetnsPod) =>
      imdsGet(pod, url(CREDENTIALS), { 'X-aws-ec2-metadata-token': await token(pod) });

    it('never matches a hostNetwork pod by IP', async () => {
      const pod = await harness.addNetnsPod('hostnet');
      const podsBefore = harness.agent.index.view.podCount();
      harness.schedulePod({ name: 'hostnet', role: 'host-role', ip: pod.ip, hostNetwork: true });
      await eventually(
        'the agent has seen the hostNetwork pod',
        () => harness.agent.index.view.podCount() > podsBefore,
      );
      assert.equal((await ask(pod)).status, 503);
    });

    it('stops serving a pod once it has Succeeded', async () => {
      const pod = await harness.addNetnsPod('job');
      harness.schedulePod({ name: 'job', role: 'job-role', ip: pod.ip });
      await harness.nextEvent((event) => event.type === 'pod.indexed' && event.pod === 'job');
      assert.equal((await ask(pod)).body, 'job-role');
      harness.schedulePod({ name: 'job', role: 'job-role', ip: pod.ip, phase: 'Succeeded' });
      await harness.nextEvent((event) => event.type === 'pod.removed' && event.pod === 'job');
      assert.equal((await ask(pod)).status, 503);
    });

    it("gives a reused IP to the new pod before and after the old pod's delete arrives", async () => {
      const pod = await harness.addNetnsPod('reuse');
      harness.schedulePod({ name: 'old', role: 'old-role', ip: pod.ip, createdAt: new Date(Date.now() - 60_000) });
      await harness.nextEvent((event) => event.type === 'pod.indexed' && event.pod === 'old');
      assert.equal((await ask(pod)).body, 'old-role');
      harness.schedulePod({ name: 'new', role: 'new-role', ip: pod.ip, phase: 'Pending', createdAt: new Date() });
      await harness.nextEvent((event) => event.type === 'pod.indexed' && event.pod === 'new');
      assert.equal((await ask(pod)).body, 'new-role', "before the old pod's delete");
      const podsBefore = harness.agent.index.view.podCount();
      harness.api.deletePod('default', 'old');
      await eventually(
        "the agent has applied the old pod's delete",
        () => harness.agent.index.view.podCount() < podsBefore,
      );
      assert.equal((await ask(pod)).body, 'new-role', "after the old pod's delete");
    });
  });
});
