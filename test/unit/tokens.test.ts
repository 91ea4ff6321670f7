import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { TokenIssuer, parseTtlHeader } from '../../src/imds/tokens.js';

describe('IMDSv2 tokens', () => {
  it('accepts TTLs 1..21600 and explains every other value', () => {
    assert.deepEqual(parseTtlHeader('21600'), { ok: true, ttlSeconds: 21600 });
    assert.deepEqual(parseTtlHeader('1'), { ok: true, ttlSeconds: 1 });
    for (const bad of [undefined, '0', '21601', '-1', 'abc', '1.5', ['60', '60']]) {
      const check = parseTtlHeader(bad);
      assert.ok(!check.ok, `rejects ${JSON.stringify(bad)}`);
      assert.match(check.reason, /X-aws-ec2-metadata-token-ttl-seconds/);
    }
  });

  it('verifies its own token for the caller it was issued to, until it expires', () => {
    let now = 1_700_000_000_000;
    const issuer = new TokenIssuer(Buffer.alloc(32, 7), () => now);
    const token = issuer.issue('10.0.0.5', 60);
    assert.deepEqual(issuer.verify(token, '10.0.0.5'), { valid: true });
    assert.deepEqual(issuer.verify(token, '10.0.0.6'), { valid: false, reason: 'token not issued to this caller' });
    assert.deepEqual(new TokenIssuer(Buffer.alloc(32, 8), () => now).verify(token, '10.0.0.5'), {
      valid: false,
      reason: 'token not issued to this caller',
    });
    now += 61_000;
    assert.deepEqual(issuer.verify(token, '10.0.0.5'), { valid: false, reason: 'token expired' });
  });

  it('refuses malformed, oversized and repeated tokens without hashing them', () => {
    const issuer = new TokenIssuer();
    for (const bad of ['', 'x'.repeat(10_000), 'abc.def', ['a', 'b']])
      assert.equal(issuer.verify(bad, '10.0.0.5').valid, false);
  });
});
