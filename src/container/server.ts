/**
 * The container-credentials door: a pod proves itself with its projected service-account token
 * (AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE), not by its source IP. The token is checked locally,
 * then by a TokenReview (cached), then against the agent's own index: the pod must be live on this
 * node with that uid and service account. The role comes from the same policy as the metadata
 * door, and the credentials from the same supply, so a pod using both doors is one identity.
 */
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { AuditEventBody, DenialCause } from '../audit/events.js';
import { podContext } from '../broker/lookup.js';
import type { IndexView } from '../broker/pod-index.js';
import { type RolePolicy, grantFor } from '../broker/policy.js';
import type { PodRecord } from '../cluster/pods.js';
import { type CredentialSupply, clientRequest } from '../credentials/supply.js';
import type { CallerLimits } from '../http/caller-limits.js';
import { peerAddress } from '../http/listen.js';
import type { ReviewCache } from './review-cache.js';
import { checkToken } from './token-claims.js';
import type { TokenSubject } from './token-review.js';
import { CREDENTIALS_PATH, containerCredentialsBody, containerErrorBody } from './wire.js';

export interface ContainerServerOptions {
  readonly index: IndexView;
  /** Why the index cannot be trusted right now (a dead watch), or undefined: the metadata door's check (indexDoubt). */
  readonly indexDoubt: () => string | undefined;
  /** The agent's node; undefined only when the agent watches every pod (tests, the demo). */
  readonly nodeName: string | undefined;
  readonly policy: RolePolicy;
  readonly baseRoleArn: () => string | undefined;
  readonly credentials: CredentialSupply;
  readonly reviews: ReviewCache;
  readonly audience: string;
  /** Host header values this door answers (src/container/wire.ts, allowedHosts). */
  readonly hosts: ReadonlySet<string>;
  readonly limits: CallerLimits;
  readonly publish: (body: AuditEventBody) => void;
  readonly onReview?: (outcome: 'cached' | 'accepted' | 'refused' | 'error') => void;
  readonly logger: Logger;
  readonly now?: () => number;
}

/** SDKs give each attempt about a second: leave room for the answer to travel. */
const CLIENT_DEADLINE_MS = 900;

class Refused extends Error {
  constructor(
    readonly status: 400 | 403 | 404 | 429 | 503,
    readonly denial: DenialCause,
    message: string,
    readonly pod?: PodRecord,
    readonly roleArn?: string,
    readonly serviceAccount?: string,
  ) {
    super(message);
  }
}

export function containerHandler(options: ContainerServerOptions): (req: IncomingMessage, res: ServerResponse) => void {
  const { index, publish, logger } = options;
  const now = options.now ?? Date.now;

  const send = (req: IncomingMessage, res: ServerResponse, status: number, body: string, requestId: string) => {
    if (res.headersSent || res.destroyed) return;
    res.writeHead(status, {
      'Content-Type': 'application/json',
      'X-Request-Id': requestId,
      'Content-Length': Buffer.byteLength(body),
    });
    res.end(req.method === 'HEAD' ? undefined : body);
  };

  /** Who the token proves, checked against the index: same uid, live, on this node, same service account. */
  const ownPod = (subject: TokenSubject): PodRecord => {
    const fail = (reason: string, pod?: PodRecord) =>
      new Refused(403, 'unknown-pod', reason, pod, undefined, subject.serviceAccount);
    const pod = index.pod(subject.podUid);
    const named = `pod ${subject.namespace}/${subject.podName} (uid ${subject.podUid})`;
    if (subject.nodeName !== undefined && options.nodeName !== undefined && subject.nodeName !== options.nodeName) {
      throw fail(`the token is bound to a pod on node ${subject.nodeName}, not this node (${options.nodeName})`);
    }
    if (!pod) throw fail(`${named} is not a live pod on this node: deleted, or scheduled elsewhere`);
    if (pod.namespace !== subject.namespace || pod.name !== subject.podName)
      throw fail(`${named} does not match the indexed pod ${pod.namespace}/${pod.name}`, pod);
    if (options.nodeName !== undefined && pod.nodeName !== options.nodeName)
      throw fail(`${named} runs on node ${pod.nodeName ?? '(none)'}, not this node`, pod);
    if (pod.serviceAccount !== subject.serviceAccount)
      throw fail(
        `${named} runs as service account ${pod.serviceAccount}, the token is for ${subject.serviceAccount}`,
        pod,
      );
    if (pod.phase === 'Succeeded' || pod.phase === 'Failed') throw fail(`${named} has finished (${pod.phase})`, pod);
    return pod;
  };

  const serve = async (req: IncomingMessage, res: ServerResponse, requestId: string, startedAt: number) => {
    const header = req.headers.authorization;
    if (header === undefined)
      throw new Refused(
        400,
        'token',
        'no Authorization header: send the contents of AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE',
      );
    const token = header.trim();
    const local = checkToken(token, options.audience, now());
    if (!local.ok) throw new Refused(local.status, 'token', local.reason);
    // The index is the last word on which pods exist: a review means nothing against an index that cannot be trusted.
    if (!index.health('pods').synced)
      throw new Refused(503, 'index-stale', 'the agent has not listed the pods on this node yet; retry');
    const doubt = options.indexDoubt();
    if (doubt !== undefined) throw new Refused(503, 'index-stale', doubt);
    let reviewed;
    try {
      reviewed = await options.reviews.review(token, local.expiresAtMs);
    } catch (error) {
      options.onReview?.('error');
      throw new Refused(503, 'token', `the API server could not review the token: ${(error as Error).message}; retry`);
    }
    options.onReview?.(reviewed.cached ? 'cached' : reviewed.review.authenticated ? 'accepted' : 'refused');
    if (!reviewed.review.authenticated) throw new Refused(403, 'token', reviewed.review.reason);
    const pod = ownPod(reviewed.review.subject);
    const grant = grantFor(
      { kind: 'found', ...podContext(index, pod), resolvedBy: 'index', waitedMs: 0 },
      pod.ips[0] ?? '',
      options.policy,
      options.baseRoleArn(),
    );
    switch (grant.kind) {
      case 'retry':
        throw new Refused(503, 'base-arn-unknown', grant.reason, pod);
      case 'no-role':
        throw new Refused(404, 'no-role', grant.reason, pod);
      case 'denied':
        throw new Refused(403, 'role-denied', grant.reason, pod, grant.roleArn);
      case 'role':
        break;
    }
    const { identity } = grant;
    let supplied;
    try {
      supplied = await options.credentials(
        identity,
        clientRequest(Math.max(0, CLIENT_DEADLINE_MS - (now() - startedAt))),
      );
    } catch (error) {
      throw new Refused(
        503,
        'sts-failed',
        `could not get credentials for ${identity.roleArn}: ${(error as Error).message}`,
        pod,
        identity.roleArn,
      );
    }
    publish({
      type: 'credential.issued',
      ...subjectOf(requestId, req, pod, identity.roleArn),
      source: grant.source,
      resolvedBy: 'index',
      waitedMs: now() - startedAt,
      expiration: supplied.credentials.expiration.toISOString(),
      cache: supplied.freshness,
    });
    send(req, res, 200, containerCredentialsBody(supplied.credentials), requestId);
  };

  const refuse = (
    req: IncomingMessage,
    res: ServerResponse,
    requestId: string,
    startedAt: number,
    refusal: Refused,
  ) => {
    const subject = subjectOf(requestId, req, refusal.pod, refusal.roleArn);
    if (refusal.status === 429) publish({ type: 'request.throttled', ...subject, limit: 'rate' });
    else
      publish({
        type: 'credential.denied',
        ...subject,
        serviceAccount: subject.serviceAccount ?? refusal.serviceAccount,
        status: refusal.status,
        cause: refusal.denial,
        reason: refusal.message,
        waitedMs: now() - startedAt,
      });
    send(req, res, refusal.status, containerErrorBody(refusal.status, refusal.message), requestId);
  };

  return (req, res) => {
    const requestId = randomUUID();
    const startedAt = now();
    const ip = peerAddress(req.socket);
    const admission = options.limits.admit(ip);
    if (!admission.admitted) {
      res.setHeader('Retry-After', String(admission.retryAfterSeconds));
      res.setHeader('Connection', 'close');
      return refuse(req, res, requestId, startedAt, new Refused(429, 'token', 'too many requests from this address'));
    }
    // Checked before anything else is read: a page that rebinds a name to this address gets nothing.
    if (!options.hosts.has((req.headers.host ?? '').toLowerCase())) {
      return send(
        req,
        res,
        403,
        containerErrorBody(
          403,
          `Host ${JSON.stringify((req.headers.host ?? '').slice(0, 100))} is not this endpoint's address`,
        ),
        requestId,
      );
    }
    const path = (req.url ?? '/').split('?')[0];
    if (path !== CREDENTIALS_PATH)
      return send(
        req,
        res,
        404,
        containerErrorBody(404, `${(path ?? '').slice(0, 100)} is not served here: use GET ${CREDENTIALS_PATH}`),
        requestId,
      );
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('Allow', 'GET, HEAD');
      return send(req, res, 405, containerErrorBody(405, `method ${req.method} not allowed: use GET`), requestId);
    }
    serve(req, res, requestId, startedAt).catch((error: unknown) => {
      if (error instanceof Refused) return refuse(req, res, requestId, startedAt, error);
      logger.error({ err: String(error), requestId }, 'container-credentials request failed');
      send(req, res, 500, containerErrorBody(500, 'internal error'), requestId);
    });
  };
}

const subjectOf = (
  requestId: string,
  req: IncomingMessage,
  pod: PodRecord | undefined,
  roleArn: string | undefined,
) => ({
  requestId,
  door: 'container' as const,
  podIp: peerAddress(req.socket),
  namespace: pod?.namespace,
  pod: pod?.name,
  serviceAccount: pod?.serviceAccount,
  roleArn,
});
