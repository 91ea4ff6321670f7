import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { loadConfig } from '../../src/config/load.js';
import { DeadlineExceeded } from '../../src/credentials/deadline.js';
import { type CredentialSupplyOptions, credentialSupply } from '../../src/credentials/layers.js';
import { minimumRemainingMs, refreshDelayMs, supplyProblems } from '../../src/credentials/lifetimes.js';
import { type AssumeRole, type StsCallReport, StsError } from '../../src/credentials/sts.js';
import { clientRequest } from '../../src/credentials/supply.js';
import type { Credentials } from '../../src/model/credentials.js';
import type { RoleIdentity } from '../../src/model/role-identity.js';
import { eventually } from '../../testkit/eventually.js';

const identity: RoleIdentity = {
  roleArn: 'arn:aws:iam::123456789012:role/reader',
  externalId: undefined,
  sessionName: 'shop@web',
};

function countingSts(now: () => number) {
  const calls: RoleIdentity[] = [];
  const assumeRole: AssumeRole = async (id, durationSeconds) => {
    calls.push(id);
    await new Promise((resolve) => setImmediate(resolve));
    const credentials: Credentials = {
      accessKeyId: `ASIA${calls.length}`,
      secretAccessKey: 's',
      sessionToken: 't',
      issuedAt: new Date(now()),
      expiration: new Date(now() + durationSeconds * 1000),
      accountId: '123456789012',
    };
    return credentials;
  };
  return { calls, assumeRole };
}

/** The assembled layers, asked the way a door asks. */
function supplyWith(options: CredentialSupplyOptions) {
  const stack = credentialSupply(options);
  return { ...stack, get: (id: RoleIdentity, deadlineMs?: number) => stack.supply(id, clientRequest(deadlineMs)) };
}

describe('credential supply: cache', () => {
  it('makes one STS call for concurrent requests of one identity', async () => {
    const now = 0;
    const sts = countingSts(() => now);
    const cache = supplyWith({ assumeRole: sts.assumeRole, sessionDurationSeconds: 3600, now: () => now });
    const results = await Promise.all(Array.from({ length: 20 }, () => cache.get(identity)));
    assert.equal(sts.calls.length, 1);
    assert.equal(new Set(results.map((r) => r.credentials.accessKeyId)).size, 1);
    assert.equal((await cache.get(identity)).freshness, 'hit');
  });

  it('keeps identities apart by role, external ID and session name', async () => {
    const sts = countingSts(() => 0);
    const cache = supplyWith({ assumeRole: sts.assumeRole, sessionDurationSeconds: 3600, now: () => 0 });
    await cache.get(identity);
    await cache.get({ ...identity, sessionName: 'shop@other' });
    await cache.get({ ...identity, externalId: 'ext' });
    assert.equal(sts.calls.length, 3);
  });

  it('never hands out credentials with less than 30 minutes left (1 h sessions)', async () => {
    let now = 0;
    const sts = countingSts(() => now);
    const cache = supplyWith({ assumeRole: sts.assumeRole, sessionDurationSeconds: 3600, now: () => now });
    await cache.get(identity);
    now = 29 * 60_000;
    assert.equal((await cache.get(identity)).freshness, 'hit');
    now = 30 * 60_000 + 1;
    const refreshed = await cache.get(identity);
    assert.equal(refreshed.freshness, 'miss');
    assert.ok(refreshed.credentials.expiration.getTime() - now >= 30 * 60_000);
  });

  it('lets a failed call fail every waiter and retries on the next request', async () => {
    let fail = true;
    const cache = supplyWith({
      assumeRole: async () => {
        if (fail) throw new Error('Throttling');
        return {
          accessKeyId: 'A',
          secretAccessKey: 's',
          sessionToken: 't',
          issuedAt: new Date(0),
          expiration: new Date(3_600_000),
          accountId: '1',
        };
      },
      sessionDurationSeconds: 3600,
      now: () => 0,
      random: () => 0,
    });
    await assert.rejects(Promise.all([cache.get(identity), cache.get(identity)]), /Throttling/);
    fail = false;
    assert.equal((await cache.get(identity)).credentials.accessKeyId, 'A');
  });
});

const throttled = () => new StsError('Throttling: Rate exceeded', 'Throttling', true, true);

describe('credential supply: STS discipline, refresh, static stability', () => {
  it('retries throttling with backoff until STS answers, counting each attempt', async () => {
    const reports: StsCallReport[] = [];
    let calls = 0;
    const cache = supplyWith({
      assumeRole: async () => {
        if (++calls <= 3) throw throttled();
        return credentialsExpiringAt(3_600_000);
      },
      sessionDurationSeconds: 3600,
      now: () => 0,
      random: () => 0,
      onStsCall: (report) => reports.push(report),
    });
    assert.equal((await cache.get(identity)).freshness, 'miss');
    assert.deepEqual(
      reports.map((r) => r.error?.throttled ?? false),
      [true, true, true, false],
    );
    cache.stop();
  });

  it('does not retry errors STS says are final', async () => {
    let calls = 0;
    const cache = supplyWith({
      assumeRole: async () => {
        calls++;
        throw new StsError('AccessDenied', 'AccessDenied', false, false);
      },
      sessionDurationSeconds: 3600,
      random: () => 0,
    });
    await assert.rejects(cache.get(identity), /AccessDenied/);
    assert.equal(calls, 1);
  });

  it('serves still-valid credentials below the usual minimum life when STS fails (static stability)', async () => {
    let now = 0;
    let fail = false;
    const cache = supplyWith({
      assumeRole: async () => {
        if (fail) throw new StsError('InvalidClientTokenId', 'InvalidClientTokenId', false, false);
        return credentialsExpiringAt(now + 3_600_000);
      },
      sessionDurationSeconds: 3600,
      now: () => now,
      random: () => 0,
    });
    const first = await cache.get(identity);
    fail = true;
    now = 50 * 60_000; // 10 min left: below the 30 min minimum, still valid
    const stale = await cache.get(identity);
    assert.equal(stale.freshness, 'stale');
    assert.equal(stale.credentials.accessKeyId, first.credentials.accessKeyId);
    now = 60 * 60_000 + 1; // really expired: nothing to serve
    await assert.rejects(cache.get(identity), /InvalidClientTokenId/);
  });

  it('answers by the deadline (retryable) while the fetch finishes in the background for the next request', async () => {
    let release: () => void = () => undefined;
    const cache = supplyWith({
      assumeRole: () =>
        new Promise<Credentials>((resolve) => (release = () => resolve(credentialsExpiringAt(Date.now() + 3_600_000)))),
      sessionDurationSeconds: 3600,
    });
    await assert.rejects(
      cache.get(identity, 20),
      (error) => error instanceof DeadlineExceeded && error.deadlineMs === 20,
    );
    release();
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal((await cache.get(identity, 20)).freshness, 'hit');
  });

  it('prefetches a tracked identity, refreshes it ahead of the minimum life, and forgets it when untracked', async () => {
    const now = 0;
    const sts = countingSts(() => now);
    const cache = supplyWith({
      assumeRole: sts.assumeRole,
      sessionDurationSeconds: 3600,
      now: () => now,
      random: () => 0,
    });
    cache.track(identity);
    // A fixed sleep raced the fetch's own event-loop turns on a loaded machine.
    await eventually('the fetch started by track has stored its credentials', () => cache.size() === 1);
    assert.equal(sts.calls.length, 1, 'fetched on track');
    assert.equal((await cache.get(identity)).freshness, 'hit');
    cache.untrack(identity);
    assert.equal(cache.size(), 0);
    cache.stop();
  });

  it('with first-use prefetch, fetches a tracked identity at its first request only', async () => {
    const now = 0;
    const sts = countingSts(() => now);
    const cache = supplyWith({
      assumeRole: sts.assumeRole,
      sessionDurationSeconds: 3600,
      now: () => now,
      random: () => 0,
      prefetch: 'first-use',
    });
    cache.track(identity);
    cache.track({ ...identity, sessionName: 'shop@never-asks' });
    await new Promise((resolve) => setTimeout(resolve, 5));
    assert.equal(sts.calls.length, 0, 'no STS call for pods that have not asked');
    assert.equal((await cache.get(identity)).freshness, 'miss');
    assert.equal((await cache.get(identity)).freshness, 'hit');
    assert.equal(sts.calls.length, 1);
    assert.equal(
      loadConfig([], {}).prefetch,
      'arrival',
      'the default serves most clusters: first requests are cache hits',
    );
    assert.equal(loadConfig([], { BROKER_PREFETCH: 'first-use' }).prefetch, 'first-use');
    cache.stop();
  });

  it('keeps at most maxEntries identities, evicting those no live pod uses first', async () => {
    const sts = countingSts(() => 0);
    const cache = supplyWith({ assumeRole: sts.assumeRole, sessionDurationSeconds: 3600, now: () => 0, maxEntries: 2 });
    const live = { ...identity, sessionName: 'shop@live' };
    cache.track(live);
    await cache.get(live);
    await cache.get({ ...identity, sessionName: 'shop@a' });
    await cache.get({ ...identity, sessionName: 'shop@b' });
    assert.equal(cache.size(), 2);
    assert.equal((await cache.get(live)).freshness, 'hit', 'the identity of a live pod stayed');
    cache.stop();
  });

  it('plans refreshes before the minimum remaining life, spread by jitter', () => {
    const expiration = 3_600_000;
    const early = refreshDelayMs(expiration, 0, 3600, () => 1);
    const late = refreshDelayMs(expiration, 0, 3600, () => 0);
    assert.equal(late, 25 * 60_000);
    assert.equal(early, 20 * 60_000);
    assert.ok(expiration - late >= minimumRemainingMs(3600));
  });

  it('refuses option combinations that hand out too little life or leave no time for STS', () => {
    assert.deepEqual(
      supplyProblems({ sessionDurationSeconds: 3600, graceWindowMs: 300, credentialDeadlineMs: undefined }),
      [],
    );
    assert.deepEqual(
      supplyProblems({ sessionDurationSeconds: 3600, graceWindowMs: undefined, credentialDeadlineMs: 200 }),
      [],
      'an unset grace window bounds nothing',
    );
    assert.match(
      supplyProblems({ sessionDurationSeconds: 1800, graceWindowMs: 300, credentialDeadlineMs: undefined }).join(),
      /BROKER_SESSION_DURATION=1800s .* at least 50m/,
    );
    assert.match(
      supplyProblems({ sessionDurationSeconds: 3600, graceWindowMs: 500, credentialDeadlineMs: 400 }).join(),
      /BROKER_CREDENTIAL_DEADLINE_MS=400 must exceed BROKER_GRACE_WINDOW_MS=500/,
    );
    assert.throws(
      () => loadConfig([], { BROKER_SESSION_DURATION: '30m' }),
      /BROKER_SESSION_DURATION=1800s .* at least 50m/,
    );
  });
});

function credentialsExpiringAt(expirationMs: number): Credentials {
  return {
    accessKeyId: `ASIA${expirationMs}`,
    secretAccessKey: 's',
    sessionToken: 't',
    issuedAt: new Date(0),
    expiration: new Date(expirationMs),
    accountId: '123456789012',
  };
}
