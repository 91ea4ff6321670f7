/** Each credential supply layer alone, over a stub of the layer below. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { cached } from '../../src/credentials/cache.js';
import { DeadlineExceeded, withinDeadline } from '../../src/credentials/deadline.js';
import { rateLimited } from '../../src/credentials/rate-limit.js';
import { refreshAhead } from '../../src/credentials/refresh-ahead.js';
import { retrying } from '../../src/credentials/retry.js';
import { staticStability } from '../../src/credentials/static-stability.js';
import { type StsCallReport, StsError, stsSupply } from '../../src/credentials/sts.js';
import {
  type CredentialSupply,
  SupplyStopped,
  type SupplyRequest,
  clientRequest,
} from '../../src/credentials/supply.js';
import type { Credentials } from '../../src/model/credentials.js';
import { type RoleIdentity, identityKey } from '../../src/model/role-identity.js';

const identity: RoleIdentity = {
  roleArn: 'arn:aws:iam::123456789012:role/reader',
  externalId: undefined,
  sessionName: 'shop@web',
};
const other: RoleIdentity = { ...identity, sessionName: 'shop@other' };

const credentials = (expirationMs: number, accessKeyId = `ASIA${expirationMs}`): Credentials => ({
  accessKeyId,
  secretAccessKey: 's',
  sessionToken: 't',
  issuedAt: new Date(0),
  expiration: new Date(expirationMs),
  accountId: '123456789012',
});

/** A layer below that records what it was asked and answers as told. */
function stub(
  answer: (call: number, request: SupplyRequest) => Promise<Credentials> = async () => credentials(3_600_000),
) {
  const calls: Array<{ identity: RoleIdentity; request: SupplyRequest; priority: string; renew: boolean }> = [];
  const supply: CredentialSupply = async (id, request) => {
    calls.push({ identity: id, request, priority: request.priority, renew: request.renew ?? false });
    return { credentials: await answer(calls.length, request), freshness: 'miss' };
  };
  return { calls, supply };
}

/** A layer below whose answers wait until the test releases them. */
function heldStub() {
  let release: () => void = () => undefined;
  const released = new Promise<void>((resolve) => (release = resolve));
  let answered = 0;
  const below = stub(async () => {
    await released;
    answered++;
    return credentials(3_600_000);
  });
  return { ...below, release: () => release(), answered: () => answered };
}

const settle = () => new Promise((resolve) => setImmediate(resolve));

describe('STS layer', () => {
  it('answers a miss, turns every failure into an StsError, and counts the attempts of one request', async () => {
    const reports: StsCallReport[] = [];
    let calls = 0;
    const sts = stsSupply(
      async (_id, durationSeconds) => {
        if (++calls === 1) throw new Error('socket hang up');
        return credentials(durationSeconds * 1000);
      },
      900,
      (report) => reports.push(report),
    );
    const request = clientRequest();
    await assert.rejects(
      sts(identity, request),
      (error) => error instanceof StsError && error.retryable && /socket hang up/.test(error.message),
    );
    request.priority = 'background';
    const supplied = await sts(identity, request);
    assert.equal(supplied.freshness, 'miss');
    assert.equal(supplied.credentials.expiration.getTime(), 900_000, 'asked for the session duration');
    await sts(identity, clientRequest());
    assert.deepEqual(
      reports.map(({ attempt, trigger, error }) => ({ attempt, trigger, failed: error !== undefined })),
      [
        { attempt: 0, trigger: 'client', failed: true },
        { attempt: 1, trigger: 'background', failed: false },
        { attempt: 0, trigger: 'client', failed: false },
      ],
    );
  });
});

describe('rate-limit layer', () => {
  it('lets each call through only with a token, counts the waiting, and refuses them when stopped', async () => {
    const below = stub();
    const limit = rateLimited(below.supply, { ratePerSecond: 1, burst: 1, now: () => 0 });
    await limit.supply(identity, clientRequest());
    const waiting = limit.supply(other, clientRequest());
    await settle();
    assert.equal(below.calls.length, 1, 'no token left for the second call');
    assert.equal(limit.waiting(), 1);
    limit.stop();
    await assert.rejects(waiting, /stopped/);
    assert.equal(below.calls.length, 1);
  });

  it('does not spend a token granted just before stop on a call', async () => {
    const below = stub();
    const limit = rateLimited(below.supply, { ratePerSecond: 1, burst: 1, now: () => 0 });
    const granted = limit.supply(identity, clientRequest());
    limit.stop();
    await assert.rejects(granted, /stopped/);
    assert.equal(below.calls.length, 0);
  });
});

describe('retry layer', () => {
  const retryable = (error: unknown) => error instanceof StsError && error.retryable;
  const throttled = () => new StsError('Throttling', 'Throttling', true, true);

  it('retries retryable errors with the same request, up to the attempts, and not final ones', async () => {
    const below = stub(async (call) => {
      if (call <= 2) throw throttled();
      return credentials(3_600_000);
    });
    const retries = retrying(below.supply, { initialMs: 1, maxMs: 1, attempts: 3, retryable, random: () => 0 });
    const request = clientRequest();
    assert.equal((await retries.supply(identity, request)).freshness, 'miss');
    assert.equal(below.calls.length, 3);
    assert.ok(
      below.calls.every((call) => call.request === request),
      'one request object, so priority changes reach every attempt',
    );

    const alwaysThrottled = stub(async () => {
      throw throttled();
    });
    await assert.rejects(
      retrying(alwaysThrottled.supply, { initialMs: 1, maxMs: 1, attempts: 3, retryable, random: () => 0 }).supply(
        identity,
        clientRequest(),
      ),
      /Throttling/,
    );
    assert.equal(alwaysThrottled.calls.length, 3, 'gives up after the attempts');

    const denied = stub(async () => {
      throw new StsError('AccessDenied', 'AccessDenied', false, false);
    });
    await assert.rejects(
      retrying(denied.supply, { initialMs: 1, maxMs: 1, attempts: 3, retryable, random: () => 0 }).supply(
        identity,
        clientRequest(),
      ),
      /AccessDenied/,
    );
    assert.equal(denied.calls.length, 1);
  });

  it('ends a backoff wait when stopped', async () => {
    const below = stub(async () => {
      throw throttled();
    });
    const retries = retrying(below.supply, {
      initialMs: 60_000,
      maxMs: 60_000,
      attempts: 3,
      retryable,
      random: () => 1,
    });
    const pending = retries.supply(identity, clientRequest());
    await settle();
    retries.stop();
    await assert.rejects(pending, SupplyStopped);
    assert.equal(below.calls.length, 1);
  });
});

describe('cache layer (single flight + bounded LRU)', () => {
  const fresh = (c: Credentials) => c.expiration.getTime() > 1_000;

  it('makes one call for requests that arrive together, then answers hits; renew asks again', async () => {
    const below = heldStub();
    const cache = cached(below.supply, { isFresh: fresh, keep: () => false });
    const together = Promise.all([cache.supply(identity, clientRequest()), cache.supply(identity, clientRequest())]);
    below.release();
    assert.deepEqual(
      (await together).map((s) => s.freshness),
      ['miss', 'miss'],
    );
    assert.equal(below.calls.length, 1);
    assert.equal((await cache.supply(identity, clientRequest())).freshness, 'hit');
    assert.equal((await cache.supply(identity, { priority: 'background', renew: true })).freshness, 'miss');
    assert.equal(below.calls.length, 2);
  });

  it('raises the priority of a background fetch a client joins', async () => {
    const below = heldStub();
    const cache = cached(below.supply, { isFresh: fresh, keep: () => false });
    const background = cache.supply(identity, { priority: 'background', renew: true });
    const client = cache.supply(identity, clientRequest());
    await settle();
    assert.equal(below.calls[0]?.request.priority, 'client');
    below.release();
    await Promise.all([background, client]);
    assert.equal(below.calls.length, 1);
  });

  it('asks again for credentials no longer fresh, and shares a failure among the requests that waited for it', async () => {
    let expirationMs = 500;
    const below = stub(async (call) => {
      if (call === 2) throw new Error('STS down');
      return credentials(expirationMs);
    });
    const cache = cached(below.supply, { isFresh: fresh, keep: () => false });
    await cache.supply(identity, clientRequest());
    await assert.rejects(
      Promise.all([cache.supply(identity, clientRequest()), cache.supply(identity, clientRequest())]),
      /STS down/,
    );
    assert.equal(below.calls.length, 2);
    expirationMs = 3_600_000;
    assert.equal((await cache.supply(identity, clientRequest())).credentials.expiration.getTime(), 3_600_000);
    assert.equal(cache.peek(identity)?.expiration.getTime(), 3_600_000);
  });

  it('evicts the least recently used identity that is not kept; peek is not a use; forget drops', async () => {
    const below = stub();
    const kept = identityKey({ ...identity, sessionName: 'shop@kept' });
    const cache = cached(below.supply, { isFresh: fresh, maxEntries: 2, keep: (key) => key === kept });
    const a = { ...identity, sessionName: 'shop@a' };
    const b = { ...identity, sessionName: 'shop@b' };
    await cache.supply({ ...identity, sessionName: 'shop@kept' }, clientRequest());
    await cache.supply(a, clientRequest());
    await cache.supply(b, clientRequest());
    assert.equal(cache.size(), 2);
    assert.equal(cache.peek(a), undefined, 'a went: the oldest not kept');
    assert.ok(cache.peek({ ...identity, sessionName: 'shop@kept' }));
    cache.forget(b);
    assert.equal(cache.size(), 1);
  });
});

describe('refresh-ahead layer', () => {
  const HOUR = 3_600_000;

  function setup(answer?: (call: number) => Promise<Credentials>) {
    const below = stub(answer);
    const held = new Map<string, Credentials>();
    const forgotten: RoleIdentity[] = [];
    let jitterDraws = 0;
    const refresh = refreshAhead(below.supply, {
      peek: (id) => held.get(identityKey(id)),
      forget: (id) => forgotten.push(id),
      isFresh: (c) => c.expiration.getTime() >= 30 * 60_000,
      sessionDurationSeconds: 3600,
      now: () => 0,
      random: () => {
        jitterDraws++;
        return 0;
      },
    });
    return { below, held, forgotten, refresh, jitterDraws: () => jitterDraws };
  }

  it('fetches a tracked identity at once in the background, renews it ahead of the minimum life, and forgets it with its last user', async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const { below, forgotten, refresh } = setup(async () => credentials(HOUR));
    refresh.track(identity);
    refresh.track(identity); // a dual-stack pod: two IPs, one identity
    assert.deepEqual(
      below.calls.map(({ priority, renew }) => ({ priority, renew })),
      [{ priority: 'background', renew: true }],
    );
    await settle();
    t.mock.timers.tick(25 * 60_000 - 1);
    assert.equal(below.calls.length, 1);
    t.mock.timers.tick(1); // 25 min: 30 min minimum life and a 5 min lead before expiry
    assert.equal(below.calls.length, 2);
    refresh.untrack(identity);
    assert.equal(forgotten.length, 0, 'one user is left');
    assert.ok(refresh.tracks(identityKey(identity)));
    refresh.untrack(identity);
    assert.deepEqual(forgotten, [identity]);
    assert.equal(refresh.tracks(identityKey(identity)), false);
    await settle();
    t.mock.timers.tick(HOUR);
    assert.equal(below.calls.length, 2, 'no refresh after the last user went');
  });

  it('plans from fresh credentials already held, without a call; retries a failed refresh later', async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const { below, held, refresh } = setup(async (call) => {
      if (call === 1) throw new Error('STS down');
      return credentials(HOUR);
    });
    held.set(identityKey(identity), credentials(HOUR));
    refresh.track(identity);
    assert.equal(below.calls.length, 0);
    t.mock.timers.tick(25 * 60_000);
    assert.equal(below.calls.length, 1, 'renewed on plan');
    await settle();
    t.mock.timers.tick(10_000); // the first retry after a failed refresh (no jitter here)
    assert.equal(below.calls.length, 2);
    refresh.stop();
  });

  it("plans a client's fetch of a tracked identity, once however many requests shared it", async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const shared = credentials(HOUR);
    const { below, held, refresh, jitterDraws } = setup(async () => shared);
    held.set(identityKey(identity), credentials(HOUR));
    refresh.track(identity); // planned from what is held: renewal at 25 min
    t.mock.timers.tick(20 * 60_000);
    await Promise.all([refresh.supply(identity, clientRequest()), refresh.supply(identity, clientRequest())]);
    assert.equal(jitterDraws(), 2, 'planned on track and once for the shared fetch');
    t.mock.timers.tick(5 * 60_000);
    assert.equal(below.calls.length, 2, 'the client fetches moved the plan: no renewal at 25 min');
    t.mock.timers.tick(20 * 60_000);
    assert.equal(below.calls.length, 3, 'one renewal 25 min after the client fetches');
    refresh.stop();
  });
});

describe('deadline layer', () => {
  it('gives up waiting at the deadline with its own error while the call below goes on', async () => {
    const below = heldStub();
    const bounded = withinDeadline(below.supply);
    await assert.rejects(
      bounded(identity, clientRequest(10)),
      (error) =>
        error instanceof DeadlineExceeded && !(error instanceof StsError) && /within 10 ms/.test(error.message),
    );
    below.release();
    await settle();
    assert.equal(below.answered(), 1);
    assert.equal(
      (await bounded(identity, clientRequest())).freshness,
      'miss',
      'no deadline: waits as long as it takes',
    );
  });
});

describe('static-stability layer', () => {
  it('serves the last credentials while still valid when the layer below fails, and the failure once they expired', async () => {
    let now = 0;
    let last: Credentials | undefined;
    const below = stub(async () => {
      throw new Error('STS down');
    });
    const stable = staticStability(below.supply, { lastKnown: () => last, now: () => now });
    await assert.rejects(stable(identity, clientRequest()), /STS down/, 'nothing held');
    last = credentials(60_000);
    const stale = await stable(identity, clientRequest());
    assert.equal(stale.freshness, 'stale');
    assert.equal(stale.credentials, last);
    now = 60_000;
    await assert.rejects(stable(identity, clientRequest()), /STS down/);
  });
});
