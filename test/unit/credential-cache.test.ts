import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { RoleIdentity } from '../../src/broker/policy.js';
import { CredentialCache } from '../../src/credentials/cache.js';
import type { AssumeRole, Credentials } from '../../src/credentials/sts.js';

const identity: RoleIdentity = { roleArn: 'arn:aws:iam::123456789012:role/reader', externalId: undefined, sessionName: 'shop@web' };

function countingSts(now: () => number) {
  const calls: RoleIdentity[] = [];
  const assumeRole: AssumeRole = async (id, durationSeconds) => {
    calls.push(id);
    await new Promise((resolve) => setImmediate(resolve));
    const credentials: Credentials = { accessKeyId: `ASIA${calls.length}`, secretAccessKey: 's', sessionToken: 't', issuedAt: new Date(now()), expiration: new Date(now() + durationSeconds * 1000), accountId: '123456789012' };
    return credentials;
  };
  return { calls, assumeRole };
}

describe('credential cache', () => {
  it('makes one STS call for concurrent requests of one identity', async () => {
    let now = 0;
    const sts = countingSts(() => now);
    const cache = new CredentialCache({ assumeRole: sts.assumeRole, sessionDurationSeconds: 3600, now: () => now });
    const results = await Promise.all(Array.from({ length: 20 }, () => cache.get(identity)));
    assert.equal(sts.calls.length, 1);
    assert.equal(new Set(results.map((r) => r.credentials.accessKeyId)).size, 1);
    assert.equal((await cache.get(identity)).cached, true);
  });

  it('keeps identities apart by role, external ID and session name', async () => {
    const sts = countingSts(() => 0);
    const cache = new CredentialCache({ assumeRole: sts.assumeRole, sessionDurationSeconds: 3600, now: () => 0 });
    await cache.get(identity);
    await cache.get({ ...identity, sessionName: 'shop@other' });
    await cache.get({ ...identity, externalId: 'ext' });
    assert.equal(sts.calls.length, 3);
  });

  it('never hands out credentials with less than 30 minutes left (1 h sessions)', async () => {
    let now = 0;
    const sts = countingSts(() => now);
    const cache = new CredentialCache({ assumeRole: sts.assumeRole, sessionDurationSeconds: 3600, now: () => now });
    await cache.get(identity);
    now = 29 * 60_000;
    assert.equal((await cache.get(identity)).cached, true);
    now = 30 * 60_000 + 1;
    const refreshed = await cache.get(identity);
    assert.equal(refreshed.cached, false);
    assert.ok(refreshed.credentials.expiration.getTime() - now >= 30 * 60_000);
  });

  it('lets a failed call fail every waiter and retries on the next request', async () => {
    let fail = true;
    const cache = new CredentialCache({
      assumeRole: async () => {
        if (fail) throw new Error('Throttling');
        return { accessKeyId: 'A', secretAccessKey: 's', sessionToken: 't', issuedAt: new Date(0), expiration: new Date(3_600_000), accountId: '1' };
      },
      sessionDurationSeconds: 3600,
      now: () => 0,
    });
    await assert.rejects(Promise.all([cache.get(identity), cache.get(identity)]), /Throttling/);
    fail = false;
    assert.equal((await cache.get(identity)).credentials.accessKeyId, 'A');
  });
});
