/**
 * The demo's STS stand-in, spoken to by the real @aws-sdk/client-sts and by the agent's own
 * AssumeRole wrapper: if the SDK parses its answers, the demo's agent gets real-looking credentials.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AssumeRoleCommand, STSClient } from '@aws-sdk/client-sts';
import { StsError, stsAssumeRole } from '../../src/credentials/sts.js';
import { StsStandIn } from '../../src/sandbox/sts.js';

const ROLE_ARN = 'arn:aws:iam::210987654321:role/team/reporting';

describe('embedded STS stand-in', () => {
  let sts: StsStandIn;
  let client: STSClient;

  before(async () => {
    sts = await StsStandIn.start();
    client = new STSClient({
      endpoint: sts.endpoint,
      region: 'us-east-1',
      credentials: { accessKeyId: 'demo', secretAccessKey: 'demo' },
      maxAttempts: 1,
    });
  });
  after(async () => {
    client?.destroy();
    await sts?.stop();
  });

  it('answers AssumeRole so the real SDK reads credentials, the assumed-role ARN and the expiry asked for', async () => {
    const before = Date.now();
    const response = await client.send(
      new AssumeRoleCommand({
        RoleArn: ROLE_ARN,
        RoleSessionName: 'shop@reader',
        DurationSeconds: 1800,
        ExternalId: 'ext-42',
      }),
    );
    assert.match(response.Credentials?.AccessKeyId ?? '', /^ASIA[A-Z0-9]{16}$/);
    assert.ok((response.Credentials?.SecretAccessKey ?? '').length >= 40);
    assert.ok((response.Credentials?.SessionToken ?? '').length > 100);
    assert.equal(response.AssumedRoleUser?.Arn, 'arn:aws:sts::210987654321:assumed-role/reporting/shop@reader');
    const lifetimeSeconds = ((response.Credentials?.Expiration?.getTime() ?? 0) - before) / 1000;
    assert.ok(lifetimeSeconds > 1790 && lifetimeSeconds <= 1801, `lifetime ${lifetimeSeconds}s`);
    const call = sts.calls.at(-1);
    assert.deepEqual(
      {
        roleArn: call?.roleArn,
        sessionName: call?.sessionName,
        externalId: call?.externalId,
        durationSeconds: call?.durationSeconds,
        accessKeyId: call?.accessKeyId,
      },
      {
        roleArn: ROLE_ARN,
        sessionName: 'shop@reader',
        externalId: 'ext-42',
        durationSeconds: 1800,
        accessKeyId: response.Credentials?.AccessKeyId,
      },
    );
  });

  it("serves the agent's AssumeRole wrapper, which reads the account from the assumed-role ARN", async () => {
    const credentials = await stsAssumeRole(client)(
      { roleArn: ROLE_ARN, externalId: undefined, sessionName: 'default@api' },
      3600,
    );
    assert.equal(credentials.accountId, '210987654321');
    assert.ok(credentials.expiration.getTime() > Date.now() + 3590_000);
  });

  it('refuses invalid parameters with an STS error the SDK and the agent classify as a final client error', async () => {
    await assert.rejects(
      stsAssumeRole(client)({ roleArn: ROLE_ARN, externalId: undefined, sessionName: 'has space' }, 3600),
      (error: unknown) => {
        assert.ok(error instanceof StsError);
        assert.equal(error.code, 'ValidationError');
        assert.match(error.message, /RoleSessionName/);
        assert.equal(error.retryable, false);
        assert.equal(error.throttled, false);
        return true;
      },
    );
  });

  it('refuses an operation it does not implement, naming it', async () => {
    const response = await fetch(sts.endpoint, {
      method: 'POST',
      headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
      body: 'Action=GetSessionToken&Version=2011-06-15',
    });
    assert.equal(response.status, 400);
    assert.match(await response.text(), /<Code>InvalidAction<\/Code>.*GetSessionToken/);
  });
});
