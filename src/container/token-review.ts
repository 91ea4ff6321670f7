/**
 * Asks the API server who a service-account token belongs to (TokenReview), and reads the answer
 * into the pod it names. The API server checks the signature, the expiry, the audience and that
 * the pod the token is bound to still exists.
 */
import { z } from 'zod';
import { type KubeConnection, kubeRequest } from '../cluster/kube-connection.js';

const TOKEN_REVIEWS = '/apis/authentication.k8s.io/v1/tokenreviews';
const SERVICE_ACCOUNT_USER = /^system:serviceaccount:([^:]+):([^:]+)$/;
const POD_NAME = 'authentication.kubernetes.io/pod-name';
const POD_UID = 'authentication.kubernetes.io/pod-uid';
const NODE_NAME = 'authentication.kubernetes.io/node-name';

/** The pod a token proves, as the API server vouches for it. */
export interface TokenSubject {
  readonly namespace: string;
  readonly serviceAccount: string;
  readonly podName: string;
  readonly podUid: string;
  readonly nodeName: string | undefined;
}

export type Review =
  | { readonly authenticated: true; readonly subject: TokenSubject }
  | { readonly authenticated: false; readonly reason: string };

export type ReviewToken = (token: string) => Promise<Review>;

const ReviewAnswer = z.object({
  status: z
    .object({
      authenticated: z.boolean().nullish(),
      audiences: z.array(z.string()).nullish(),
      error: z.string().nullish(),
      user: z
        .object({
          username: z.string().nullish(),
          extra: z.record(z.string(), z.array(z.string())).nullish(),
        })
        .nullish(),
    })
    .nullish(),
});

/** Reads a TokenReview status: authenticated for our audience, a service account, bound to a pod. Pure. */
export function readReview(answer: unknown, audience: string): Review {
  const parsed = ReviewAnswer.safeParse(answer);
  if (!parsed.success)
    return { authenticated: false, reason: 'the API server answered the TokenReview with something that is not one' };
  const status = parsed.data.status;
  if (!status?.authenticated)
    return {
      authenticated: false,
      reason: `the API server did not authenticate the token${status?.error ? `: ${status.error}` : ''}`,
    };
  if (!status.audiences?.includes(audience))
    return { authenticated: false, reason: `the API server did not confirm audience ${audience}` };
  const user = SERVICE_ACCOUNT_USER.exec(status.user?.username ?? '');
  if (!user)
    return {
      authenticated: false,
      reason: `the token belongs to ${status.user?.username ?? 'nobody'}, not a service account`,
    };
  const extra = status.user?.extra ?? {};
  const podName = extra[POD_NAME]?.[0];
  const podUid = extra[POD_UID]?.[0];
  if (!podName || !podUid)
    return {
      authenticated: false,
      reason: 'the token is not bound to a pod (use a projected service-account token, not a Secret-based one)',
    };
  return {
    authenticated: true,
    subject: {
      namespace: user[1] as string,
      serviceAccount: user[2] as string,
      podName,
      podUid,
      nodeName: extra[NODE_NAME]?.[0],
    },
  };
}

/** A TokenReview per call; API errors reject (transient for the caller: 503). */
export function tokenReviewer(kube: KubeConnection, audience: string): ReviewToken {
  return async (token) => {
    const answer = await kubeRequest(kube, TOKEN_REVIEWS, {
      method: 'POST',
      body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token, audiences: [audience] } },
    });
    return readReview(answer, audience);
  };
}
