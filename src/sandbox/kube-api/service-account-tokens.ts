/**
 * Projected service-account tokens as a real API server makes and reviews them: RS256 JWTs with
 * the claims the kubelet's projected volume carries, bound to a pod. A review refuses a bad
 * signature or unknown key, an expired token, an audience that is not asked for, and a token
 * whose pod is gone, with the errors a real API server gives.
 */
import { type KeyObject, createHash, createSign, createVerify, generateKeyPairSync, randomUUID } from 'node:crypto';
import { isPlainObject } from './objects.js';
import { ApiError } from './status.js';

/** The API server's audience when a review names none. */
export const API_SERVER_AUDIENCE = 'https://kubernetes.default.svc.cluster.local';
const ISSUER = API_SERVER_AUDIENCE;

export interface BoundPod {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
  readonly serviceAccount: string;
  readonly nodeName: string | undefined;
}

export interface TokenRequest {
  readonly audiences: readonly string[];
  readonly expirationSeconds?: number;
  /** Signed with a key the API server does not know: as a token forged, or from another cluster. */
  readonly foreignKey?: boolean;
  /** Issued this long ago (for expired tokens). */
  readonly issuedSecondsAgo?: number;
}

interface Signer {
  readonly kid: string;
  readonly privateKey: KeyObject;
  readonly publicKey: KeyObject;
}

const newSigner = (): Signer => {
  const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const kid = createHash('sha256')
    .update(publicKey.export({ type: 'spki', format: 'der' }))
    .digest('base64url');
  return { kid, privateKey, publicKey };
};

const encode = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');

export class ServiceAccountTokens {
  // Made on first use: an RSA key takes tens of milliseconds, and most fakes never sign a token.
  private ownSigner: Signer | undefined;
  private foreign: Signer | undefined;

  private get signer(): Signer {
    return (this.ownSigner ??= newSigner());
  }

  issue(pod: BoundPod, request: TokenRequest): string {
    const signer = request.foreignKey ? (this.foreign ??= newSigner()) : this.signer;
    const iat = Math.floor(Date.now() / 1000) - (request.issuedSecondsAgo ?? 0);
    const claims = {
      aud: request.audiences,
      exp: iat + (request.expirationSeconds ?? 3600),
      iat,
      nbf: iat,
      iss: ISSUER,
      jti: randomUUID(),
      sub: `system:serviceaccount:${pod.namespace}:${pod.serviceAccount}`,
      'kubernetes.io': {
        namespace: pod.namespace,
        pod: { name: pod.name, uid: pod.uid },
        serviceaccount: {
          name: pod.serviceAccount,
          uid: createHash('sha256').update(`${pod.namespace}/${pod.serviceAccount}`).digest('hex').slice(0, 32),
        },
        ...(pod.nodeName
          ? { node: { name: pod.nodeName, uid: createHash('sha256').update(pod.nodeName).digest('hex').slice(0, 32) } }
          : {}),
      },
    };
    const unsigned = `${encode({ alg: 'RS256', kid: signer.kid })}.${encode(claims)}`;
    const signature = createSign('RSA-SHA256').update(unsigned).sign(signer.privateKey).toString('base64url');
    return `${unsigned}.${signature}`;
  }

  /** The TokenReview answer for a create request; `findPod` says whether the bound pod still exists. */
  review(body: unknown, findPod: (namespace: string, name: string) => { uid: string } | undefined): unknown {
    if (!isPlainObject(body) || !isPlainObject(body.spec) || typeof body.spec.token !== 'string')
      throw new ApiError(400, 'TokenReview spec.token is required');
    const asked =
      Array.isArray(body.spec.audiences) && body.spec.audiences.length > 0
        ? (body.spec.audiences as string[])
        : [API_SERVER_AUDIENCE];
    const result = this.verify(body.spec.token, asked, findPod);
    return {
      apiVersion: 'authentication.k8s.io/v1',
      kind: 'TokenReview',
      metadata: { creationTimestamp: null },
      spec: { audiences: asked },
      status: result,
    };
  }

  private verify(
    token: string,
    asked: readonly string[],
    findPod: (namespace: string, name: string) => { uid: string } | undefined,
  ): Record<string, unknown> {
    const refused = (error: string) => ({ authenticated: false, user: {}, error: `[invalid bearer token, ${error}]` });
    const parts = token.split('.');
    if (parts.length !== 3) return refused('square/go-jose: compact JWS format must have three parts');
    const [header, payload, signature] = parts as [string, string, string];
    const valid = createVerify('RSA-SHA256')
      .update(`${header}.${payload}`)
      .verify(this.signer.publicKey, Buffer.from(signature, 'base64url'));
    if (!valid) return refused('square/go-jose: error in cryptographic primitive');
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as {
      aud: string[];
      exp: number;
      nbf: number;
      'kubernetes.io': {
        namespace: string;
        pod: { name: string; uid: string };
        serviceaccount: { name: string; uid: string };
        node?: { name: string; uid: string };
      };
    };
    const now = Date.now() / 1000;
    if (claims.exp < now) return refused('square/go-jose/jwt: validation failed, token is expired (exp)');
    if (claims.nbf > now) return refused('square/go-jose/jwt: validation failed, token not valid yet (nbf)');
    const audiences = asked.filter((audience) => claims.aud.includes(audience));
    if (audiences.length === 0)
      return refused(
        `token audiences ${JSON.stringify(claims.aud)} is invalid for the target audiences ${JSON.stringify(asked)}`,
      );
    const bound = claims['kubernetes.io'];
    const pod = findPod(bound.namespace, bound.pod.name);
    if (!pod) return refused(`pod "${bound.pod.name}" not found`);
    if (pod.uid !== bound.pod.uid)
      return refused(`pod "${bound.pod.name}" UID (${pod.uid}) does not match claim (${bound.pod.uid})`);
    return {
      authenticated: true,
      audiences,
      user: {
        username: `system:serviceaccount:${bound.namespace}:${bound.serviceaccount.name}`,
        uid: bound.serviceaccount.uid,
        groups: ['system:serviceaccounts', `system:serviceaccounts:${bound.namespace}`, 'system:authenticated'],
        extra: {
          'authentication.kubernetes.io/credential-id': [`JTI=${randomUUID()}`],
          'authentication.kubernetes.io/pod-name': [bound.pod.name],
          'authentication.kubernetes.io/pod-uid': [bound.pod.uid],
          ...(bound.node
            ? {
                'authentication.kubernetes.io/node-name': [bound.node.name],
                'authentication.kubernetes.io/node-uid': [bound.node.uid],
              }
            : {}),
        },
      },
    };
  }
}
