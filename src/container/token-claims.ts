/**
 * The cheap local look at a presented token, before anything costs an API call: the shape of a
 * JWT, an audience that includes ours, and an expiry in the future. The signature is not checked
 * here: the API server is the verifier (TokenReview). This only keeps garbage away from it.
 */
import { z } from 'zod';

/** A projected token is about 1 KB; a caller sending far more is not sending one. */
export const MAX_TOKEN_BYTES = 8_192;
const BASE64URL = /^[A-Za-z0-9_-]+$/;

const Claims = z.object({
  aud: z.union([z.string(), z.array(z.string())]),
  exp: z.number().finite(),
});

export type TokenCheck =
  | { readonly ok: true; readonly expiresAtMs: number }
  | { readonly ok: false; readonly status: 400 | 403; readonly reason: string };

export function checkToken(token: string, audience: string, nowMs: number): TokenCheck {
  if (token.length === 0)
    return {
      ok: false,
      status: 400,
      reason:
        'the Authorization header is empty: send the contents of the projected token file (AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE)',
    };
  if (token.length > MAX_TOKEN_BYTES)
    return {
      ok: false,
      status: 400,
      reason: `the Authorization header is longer than ${MAX_TOKEN_BYTES} bytes: not a service-account token`,
    };
  if (/^bearer\s/i.test(token))
    return { ok: false, status: 400, reason: 'send the raw token in Authorization, without a Bearer prefix' };
  const parts = token.split('.');
  if (parts.length !== 3 || !parts.every((part) => BASE64URL.test(part)))
    return { ok: false, status: 400, reason: 'the Authorization header is not a JWT (three base64url parts)' };
  const claims = Claims.safeParse(decodeJson(parts[1] as string));
  if (!claims.success)
    return { ok: false, status: 400, reason: "the token's claims are not a JSON object with aud and exp" };
  const audiences = typeof claims.data.aud === 'string' ? [claims.data.aud] : claims.data.aud;
  if (!audiences.includes(audience))
    return {
      ok: false,
      status: 403,
      reason: `the token is not for audience ${audience} (it is for ${audiences.join(', ') || 'none'}): mount a projected token with audience ${audience}`,
    };
  const expiresAtMs = claims.data.exp * 1000;
  if (expiresAtMs <= nowMs)
    return {
      ok: false,
      status: 403,
      reason: 'the token has expired: the kubelet rotates the projected file, read it again for each request',
    };
  return { ok: true, expiresAtMs };
}

function decodeJson(part: string): unknown {
  try {
    return JSON.parse(Buffer.from(part, 'base64url').toString('utf8'));
  } catch {
    return undefined;
  }
}
