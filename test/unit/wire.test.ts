import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { credentialsBody, extendedCredentialsBody, iamInfoBody, imdsTimestamp } from '../../src/imds/wire.js';
import { credentialRoute } from '../../src/imds/server.js';

const credentials = {
  accessKeyId: 'ASIAEXAMPLE',
  secretAccessKey: 'secret',
  sessionToken: 'token',
  issuedAt: new Date('2026-11-29T19:38:27.123Z'),
  expiration: new Date('2026-11-29T20:38:27.999Z'),
  accountId: '123456789012',
};

describe('metadata wire formats', () => {
  it('writes timestamps without fractional seconds', () => {
    assert.equal(imdsTimestamp(new Date('2026-11-29T19:38:27.123Z')), '2026-11-29T19:38:27Z');
  });

  it("writes the credential document SDKs parse, in EC2's field order", () => {
    assert.equal(
      credentialsBody(credentials),
      '{"Code":"Success","LastUpdated":"2026-11-29T19:38:27Z","Type":"AWS-HMAC","AccessKeyId":"ASIAEXAMPLE","SecretAccessKey":"secret","Token":"token","Expiration":"2026-11-29T20:38:27Z"}',
    );
    assert.equal(JSON.parse(extendedCredentialsBody(credentials)).AccountId, '123456789012');
  });

  it("describes the pod's role in iam/info", () => {
    const info = JSON.parse(iamInfoBody('arn:aws:iam::123456789012:role/team/reader', new Date(0)));
    assert.equal(info.Code, 'Success');
    assert.equal(info.InstanceProfileArn, 'arn:aws:iam::123456789012:instance-profile/team/reader');
    assert.match(info.InstanceProfileId, /^AIPA[A-Z0-9]{17}$/);
  });

  it('routes the credential paths with and without the trailing slash', () => {
    assert.deepEqual(credentialRoute('/latest/meta-data/iam/security-credentials/'), {
      kind: 'role-name',
      extended: false,
    });
    assert.deepEqual(credentialRoute('/latest/meta-data/iam/security-credentials'), {
      kind: 'role-name',
      extended: false,
    });
    assert.deepEqual(credentialRoute('/latest/meta-data/iam/security-credentials/reader'), {
      kind: 'credentials',
      extended: false,
      roleName: 'reader',
    });
    assert.deepEqual(credentialRoute('/latest/meta-data/iam/security-credentials-extended/reader'), {
      kind: 'credentials',
      extended: true,
      roleName: 'reader',
    });
    assert.deepEqual(credentialRoute('/latest/meta-data/iam/info'), { kind: 'iam-info' });
    assert.equal(credentialRoute('/latest/meta-data/iam/security-credentials/team/reader'), undefined);
    assert.equal(credentialRoute('/latest/meta-data/instance-id'), undefined);
  });
});
