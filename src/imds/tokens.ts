/**
 * IMDSv2 session tokens issued by the agent itself: stateless (HMAC over expiry and the caller's
 * IP with a per-process key), so a token PUT never waits on anything and a token copied to
 * another pod is worthless there.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

export const MIN_TOKEN_TTL_SECONDS = 1;
export const MAX_TOKEN_TTL_SECONDS = 21_600;
/** Our tokens are about 60 characters; anything much longer is not one of ours and is not hashed. */
const MAX_TOKEN_LENGTH = 128;

export type TtlCheck =
  { readonly ok: true; readonly ttlSeconds: number } | { readonly ok: false; readonly reason: string };

export function parseTtlHeader(value: string | string[] | undefined): TtlCheck {
  if (value === undefined) return { ok: false, reason: 'missing X-aws-ec2-metadata-token-ttl-seconds header' };
  if (Array.isArray(value)) return { ok: false, reason: 'X-aws-ec2-metadata-token-ttl-seconds given more than once' };
  if (!/^\d{1,5}$/.test(value.trim()))
    return {
      ok: false,
      reason: `X-aws-ec2-metadata-token-ttl-seconds must be a whole number, got "${value.slice(0, 32)}"`,
    };
  const ttlSeconds = Number(value.trim());
  if (ttlSeconds < MIN_TOKEN_TTL_SECONDS || ttlSeconds > MAX_TOKEN_TTL_SECONDS) {
    return {
      ok: false,
      reason: `X-aws-ec2-metadata-token-ttl-seconds must be ${MIN_TOKEN_TTL_SECONDS}..${MAX_TOKEN_TTL_SECONDS}, got ${ttlSeconds}`,
    };
  }
  return { ok: true, ttlSeconds };
}

export type TokenCheck = { readonly valid: true } | { readonly valid: false; readonly reason: string };

export class TokenIssuer {
  constructor(
    private readonly key: Buffer = randomBytes(32),
    private readonly now: () => number = Date.now,
  ) {}

  issue(callerIp: string, ttlSeconds: number): string {
    const expiresAt = Math.floor(this.now() / 1000) + ttlSeconds;
    return `${expiresAt}.${this.sign(expiresAt, callerIp)}`;
  }

  verify(token: string | string[] | undefined, callerIp: string): TokenCheck {
    if (token === undefined) return { valid: false, reason: 'no token' };
    if (Array.isArray(token) || token.length > MAX_TOKEN_LENGTH) return { valid: false, reason: 'malformed token' };
    const match = /^(\d{1,12})\.([A-Za-z0-9_-]{43})$/.exec(token);
    if (!match) return { valid: false, reason: 'malformed token' };
    const expiresAt = Number(match[1]);
    const expected = Buffer.from(this.sign(expiresAt, callerIp));
    const given = Buffer.from(match[2] as string);
    if (!timingSafeEqual(expected, given)) return { valid: false, reason: 'token not issued to this caller' };
    if (expiresAt * 1000 <= this.now()) return { valid: false, reason: 'token expired' };
    return { valid: true };
  }

  private sign(expiresAt: number, callerIp: string): string {
    return createHmac('sha256', this.key).update(`${expiresAt}|${callerIp}`).digest('base64url');
  }
}
