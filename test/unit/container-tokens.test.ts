/** The container door's cheap local token check, the TokenReview reading, the review cache and the link. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { bringUpLink, removeDummyLink } from '../../src/node/dummy-link.js';
import { ReviewCache } from '../../src/container/review-cache.js';
import { MAX_TOKEN_BYTES, checkToken } from '../../src/container/token-claims.js';
import { type Review, readReview } from '../../src/container/token-review.js';
import { ServiceAccountTokens } from '../../src/sandbox/kube-api/service-account-tokens.js';

const NOW = 1_800_000_000_000;
const part = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');
const jwt = (claims: unknown) => `${part({ alg: 'RS256' })}.${part(claims)}.c2ln`;

describe('local token check', () => {
  it('accepts a well-formed token for our audience that has not expired, and gives its expiry', () => {
    assert.deepEqual(checkToken(jwt({ aud: ['x', 'kube-iam-broker'], exp: NOW / 1000 + 60 }), 'kube-iam-broker', NOW), {
      ok: true,
      expiresAtMs: NOW + 60_000,
    });
    assert.equal(checkToken(jwt({ aud: 'kube-iam-broker', exp: NOW / 1000 + 60 }), 'kube-iam-broker', NOW).ok, true);
  });

  it('refuses garbage with 400 and the wrong audience or an expired token with 403', () => {
    const cases: Array<[string, number, RegExp]> = [
      ['', 400, /empty/],
      ['a'.repeat(MAX_TOKEN_BYTES + 1), 400, /longer than/],
      [`Bearer ${jwt({ aud: 'kube-iam-broker', exp: NOW })}`, 400, /Bearer/],
      ['a.b', 400, /not a JWT/],
      ['a.b!.c', 400, /not a JWT/],
      [`a.${part([1, 2])}.c`, 400, /aud and exp/],
      [`a.${Buffer.from('\u0000\u00ff').toString('base64url')}.c`, 400, /aud and exp/],
      [jwt({ aud: ['sts.amazonaws.com'], exp: NOW / 1000 + 60 }), 403, /not for audience kube-iam-broker/],
      [jwt({ aud: 'kube-iam-broker', exp: NOW / 1000 }), 403, /expired/],
    ];
    for (const [token, status, reason] of cases) {
      const check = checkToken(token, 'kube-iam-broker', NOW);
      assert.ok(!check.ok, token.slice(0, 40));
      assert.equal(check.status, status, token.slice(0, 40));
      assert.match(check.reason, reason);
    }
  });
});

describe('TokenReview answer', () => {
  const status = (overrides: Record<string, unknown> = {}) => ({
    status: {
      authenticated: true,
      audiences: ['kube-iam-broker'],
      user: {
        username: 'system:serviceaccount:shop:reports',
        extra: {
          'authentication.kubernetes.io/pod-name': ['web'],
          'authentication.kubernetes.io/pod-uid': ['u-1'],
          'authentication.kubernetes.io/node-name': ['node-a'],
        },
      },
      ...overrides,
    },
  });

  it('names the pod, its service account and its node', () => {
    assert.deepEqual(readReview(status(), 'kube-iam-broker'), {
      authenticated: true,
      subject: { namespace: 'shop', serviceAccount: 'reports', podName: 'web', podUid: 'u-1', nodeName: 'node-a' },
    });
  });

  it('refuses what the API server refused, another audience, a user that is no service account, a token bound to no pod', () => {
    assert.match(
      (
        readReview(status({ authenticated: false, error: 'token is expired' }), 'kube-iam-broker') as Extract<
          Review,
          { authenticated: false }
        >
      ).reason,
      /token is expired/,
    );
    assert.equal(readReview(status({ audiences: ['other'] }), 'kube-iam-broker').authenticated, false);
    assert.equal(
      readReview(status({ user: { username: 'alice', extra: {} } }), 'kube-iam-broker').authenticated,
      false,
    );
    assert.match(
      (
        readReview(
          status({ user: { username: 'system:serviceaccount:shop:reports', extra: {} } }),
          'kube-iam-broker',
        ) as Extract<Review, { authenticated: false }>
      ).reason,
      /not bound to a pod/,
    );
    assert.equal(readReview('<html>', 'kube-iam-broker').authenticated, false);
  });
});

describe('review cache', () => {
  const accepted: Review = {
    authenticated: true,
    subject: { namespace: 'shop', serviceAccount: 'sa', podName: 'web', podUid: 'u-1', nodeName: undefined },
  };

  it('reviews a token once until it expires, shares one review among concurrent requests, and forgets a pod that goes', async () => {
    let now = 0;
    let calls = 0;
    const cache = new ReviewCache({
      review: async () => (calls++, accepted),
      maxEntries: 10,
      refusalTtlMs: 10_000,
      now: () => now,
    });
    await Promise.all([cache.review('t', 60_000), cache.review('t', 60_000)]);
    assert.equal(calls, 1);
    assert.equal((await cache.review('t', 60_000)).cached, true);
    now = 60_000;
    assert.equal((await cache.review('t', 120_000)).cached, false, 'expired with the token');
    cache.forgetPod('u-1');
    assert.equal((await cache.review('t', 120_000)).cached, false, 'forgotten with its pod');
    assert.equal(calls, 3);
  });

  it('remembers a refusal for its short while, no API error at all, and never more entries than its bound', async () => {
    let now = 0;
    let fail = true;
    const cache = new ReviewCache({
      review: async (token) => {
        if (fail) throw new Error('API server down');
        return token === 'bad' ? { authenticated: false, reason: 'no' } : accepted;
      },
      maxEntries: 3,
      refusalTtlMs: 10_000,
      now: () => now,
    });
    await assert.rejects(cache.review('bad', 1e9));
    assert.equal(cache.size(), 0);
    fail = false;
    await cache.review('bad', 1e9);
    assert.equal((await cache.review('bad', 1e9)).cached, true);
    now = 10_001;
    assert.equal((await cache.review('bad', 1e9)).cached, false);
    for (let i = 0; i < 50; i++) await cache.review(`token-${i}`, 1e9);
    assert.equal(cache.size(), 3);
  });
});

describe('dummy link', () => {
  it('adds the link (or keeps the one there), puts the address on it and brings it up', async () => {
    const calls: string[] = [];
    const outcome = await bringUpLink('kube-iam-broker', '169.254.170.23', async (args) => {
      calls.push(args.join(' '));
      return args[1] === 'add'
        ? { code: 2, stdout: '', stderr: 'RTNETLINK answers: File exists' }
        : { code: 0, stdout: '', stderr: '' };
    });
    assert.deepEqual(outcome, { kind: 'up' });
    assert.deepEqual(calls, [
      'link add kube-iam-broker type dummy',
      'addr replace 169.254.170.23/32 dev kube-iam-broker',
      'link set kube-iam-broker up',
    ]);
  });

  it('skips an IPv6 address on a node without IPv6, and reports what ip said otherwise', async () => {
    const outcome = await bringUpLink(
      'kib',
      'fd00:ec2::23',
      async () => assert.fail('no ip call'),
      () => false,
    );
    assert.equal(outcome.kind, 'skipped');
    await assert.rejects(
      bringUpLink('kib', '169.254.170.23', async () => ({
        code: 2,
        stdout: '',
        stderr: 'Error: Unknown device type.',
      })),
      /Unknown device type/,
    );
  });

  it('node-cleanup removes a dummy link of that name, reports one already gone, and never deletes another kind of link', async () => {
    const deleted: string[] = [];
    const node = (kind: string | undefined) => async (args: readonly string[]) => {
      if (args[0] === '-d')
        return kind === undefined
          ? { code: 1, stdout: '', stderr: 'Device "kib" does not exist.' }
          : {
              code: 0,
              stdout: `3: kib: <BROADCAST,NOARP,UP>\n    link/ether 02:00 \n    ${kind} addrgenmode eui64`,
              stderr: '',
            };
      deleted.push(args.join(' '));
      return { code: 0, stdout: '', stderr: '' };
    };
    assert.equal(await removeDummyLink('kib', node('dummy')), true);
    assert.equal(await removeDummyLink('kib', node(undefined)), false);
    await assert.rejects(removeDummyLink('lo', node('loopback')), /not a dummy link/);
    assert.deepEqual(deleted, ['link del kib']);
  });
});

describe("the fake API server's TokenReview, as the agent reads it", () => {
  const pod = { namespace: 'shop', name: 'web', uid: 'u-1', serviceAccount: 'sa', nodeName: 'node-a' };
  const tokens = new ServiceAccountTokens();
  const review = (token: string, live: { uid: string } | null = { uid: 'u-1' }) =>
    readReview(
      tokens.review({ spec: { token, audiences: ['kube-iam-broker'] } }, () => live ?? undefined),
      'kube-iam-broker',
    );
  const reason = (result: Review) => (result.authenticated ? 'authenticated' : result.reason);

  it('authenticates its own projected token with the pod, node and service account', () => {
    assert.deepEqual(review(tokens.issue(pod, { audiences: ['kube-iam-broker'] })), {
      authenticated: true,
      subject: { namespace: 'shop', serviceAccount: 'sa', podName: 'web', podUid: 'u-1', nodeName: 'node-a' },
    });
  });

  it('refuses an expired token, another audience, an unknown key and a pod that is gone, as a real API server does', () => {
    assert.match(
      reason(
        review(tokens.issue(pod, { audiences: ['kube-iam-broker'], expirationSeconds: 600, issuedSecondsAgo: 601 })),
      ),
      /token is expired/,
    );
    assert.match(
      reason(review(tokens.issue(pod, { audiences: ['sts.amazonaws.com'] }))),
      /invalid for the target audiences/,
    );
    assert.match(
      reason(review(tokens.issue(pod, { audiences: ['kube-iam-broker'], foreignKey: true }))),
      /cryptographic primitive/,
    );
    assert.match(reason(review(tokens.issue(pod, { audiences: ['kube-iam-broker'] }), null)), /pod "web" not found/);
    assert.match(
      reason(review(tokens.issue(pod, { audiences: ['kube-iam-broker'] }), { uid: 'u-2' })),
      /does not match claim/,
    );
  });
});
