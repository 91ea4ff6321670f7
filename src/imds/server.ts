/**
 * The metadata server pods reach through the DNAT rule. Tokens are answered at once; credential
 * paths go through the broker (which may wait for the caller's pod); a short allow-list of other
 * paths is proxied to the node's real metadata service; everything else is refused.
 */
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { AuditEventBody, DenialCause } from '../audit/events.js';
import { type Broker, type Identification, RequestAborted } from '../broker/broker.js';
import type { IndexView } from '../broker/pod-index.js';
import type { FoundOutcome } from '../broker/lookup.js';
import { type Grant, type Refusal, roleNameOf } from '../broker/policy.js';
import type { PodRecord } from '../cluster/pods.js';
import { type CredentialSupply, clientRequest } from '../credentials/supply.js';
import type { CallerLimits } from '../http/caller-limits.js';
import { peerAddress } from '../http/listen.js';
import type { RoleIdentity } from '../model/role-identity.js';
import type { ClientHold } from './client-holds.js';
import { type TokenIssuer, parseTtlHeader } from './tokens.js';
import type { Upstream } from './upstream.js';
import { IAM_LISTING, credentialsBody, extendedCredentialsBody, iamInfoBody } from './wire.js';

export interface ImdsServerOptions {
  readonly broker: Broker;
  readonly index: IndexView;
  readonly credentials: CredentialSupply;
  /** How long a credential request may wait for its pod, and be held in all, by the client that sends it. */
  readonly holdFor: (userAgent: string | undefined) => ClientHold;
  readonly tokens: TokenIssuer;
  readonly tokensRequired: boolean;
  readonly upstream: Upstream;
  /** Anchored allow-list of paths proxied to the upstream. */
  readonly allow: RegExp;
  /** Per-caller request budget and waiting lookups (src/http/caller-limits.ts). */
  readonly limits: CallerLimits;
  /** Onto the audit stream; repeated refusals of one caller are coalesced on the way (src/audit/coalesce.ts). */
  readonly publish: (body: AuditEventBody) => void;
  readonly logger: Logger;
  /** Why the index cannot be trusted right now (a dead watch), or undefined: see indexDoubt. */
  readonly indexDoubt: () => string | undefined;
}

type RoleGrant = Extract<Grant, { kind: 'role' }>;

type CredentialRoute =
  | { readonly kind: 'role-name'; readonly extended: boolean }
  | { readonly kind: 'credentials'; readonly extended: boolean; readonly roleName: string }
  | { readonly kind: 'iam-info' }
  | { readonly kind: 'iam-listing' };

const TOKEN_PATH = '/latest/api/token';
const CREDENTIAL_PATH = /^\/latest\/meta-data\/iam\/security-credentials(-extended)?(?:\/([\w+=,.@-]*))?$/;
/**
 * Never proxied, whatever the allow-list says, in any letter case: the node's credentials, its
 * user data (bootstrap secrets) and its signed identity documents (node attestation for Vault, SPIRE).
 */
const NEVER_PROXIED = /^\/[^/]+\/(meta-data\/(iam|identity-credentials)|user-data|dynamic\/instance-identity)(\/|$)/i;
/** Anything else in a path is not something an SDK sends: refuse rather than interpret it. */
const PLAIN_PATH = /^(\/[A-Za-z0-9._~+=,@-]+)*\/?$/;
const MAX_PATH_LENGTH = 512;

export function credentialRoute(path: string): CredentialRoute | undefined {
  if (path === '/latest/meta-data/iam/info' || path === '/latest/meta-data/iam/info/') return { kind: 'iam-info' };
  if (path === '/latest/meta-data/iam' || path === '/latest/meta-data/iam/') return { kind: 'iam-listing' };
  const match = CREDENTIAL_PATH.exec(path);
  if (!match) return undefined;
  const extended = match[1] !== undefined;
  return match[2] ? { kind: 'credentials', extended, roleName: match[2] } : { kind: 'role-name', extended };
}

interface Exchange {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  readonly ip: string;
  readonly requestId: string;
  readonly path: string;
  readonly signal: AbortSignal;
}

export function imdsHandler(options: ImdsServerOptions): (req: IncomingMessage, res: ServerResponse) => void {
  const { publish, logger, limits } = options;

  const reply = (exchange: Exchange, status: number, body: string) => {
    if (exchange.res.headersSent || exchange.res.destroyed) return;
    exchange.res.writeHead(status, {
      'Content-Type': 'text/plain',
      Server: 'EC2ws',
      'X-Request-Id': exchange.requestId,
      'Content-Length': Buffer.byteLength(body),
    });
    exchange.res.end(exchange.req.method === 'HEAD' ? undefined : body);
  };

  const subjectOf = (exchange: Exchange, pod: PodRecord | undefined, roleArn?: string) => ({
    requestId: exchange.requestId,
    door: 'metadata' as const,
    ...callerSubject(exchange.ip, pod),
    roleArn,
  });

  const deny = (
    exchange: Exchange,
    status: number,
    cause: DenialCause,
    reason: string,
    details: { pod?: PodRecord; roleArn?: string; requestedRole?: string; waitedMs?: number } = {},
  ) => {
    publish({
      type: 'credential.denied',
      ...subjectOf(exchange, details.pod, details.roleArn),
      status,
      reason,
      cause,
      requestedRole: details.requestedRole,
      waitedMs: details.waitedMs ?? 0,
    });
    reply(exchange, status, reason);
  };

  const issueToken = (exchange: Exchange) => {
    const refuse = (status: number, reason: string) => {
      publish({ type: 'token.refused', ...subjectOf(exchange, options.index.ownerOf(exchange.ip)), reason });
      reply(exchange, status, reason);
    };
    // Real EC2 refuses token requests that went through a proxy, so a forwarded request cannot mint one.
    if (exchange.req.headers['x-forwarded-for'] !== undefined)
      return refuse(403, 'token requests through a proxy (X-Forwarded-For) are refused');
    const ttl = parseTtlHeader(exchange.req.headers['x-aws-ec2-metadata-token-ttl-seconds']);
    if (!ttl.ok) return refuse(400, ttl.reason);
    const token = options.tokens.issue(exchange.ip, ttl.ttlSeconds);
    publish({
      type: 'token.issued',
      ...subjectOf(exchange, options.index.ownerOf(exchange.ip)),
      ttlSeconds: ttl.ttlSeconds,
    });
    exchange.res.setHeader('X-Aws-Ec2-Metadata-Token-Ttl-Seconds', String(ttl.ttlSeconds));
    reply(exchange, 200, token);
  };

  /** 401 for a missing token where tokens are required, and for a bad token always (as EC2 does). */
  const tokenProblem = (exchange: Exchange): string | undefined => {
    const token = exchange.req.headers['x-aws-ec2-metadata-token'];
    if (token === undefined)
      return options.tokensRequired ? 'a session token is required (PUT /latest/api/token first)' : undefined;
    const check = options.tokens.verify(token, exchange.ip);
    return check.valid ? undefined : `invalid session token: ${check.reason}`;
  };

  const throttle = (exchange: Exchange, limit: 'rate' | 'waiting', retryAfterSeconds: number) => {
    publish({ type: 'request.throttled', ...subjectOf(exchange, options.index.ownerOf(exchange.ip)), limit });
    exchange.res.setHeader('Retry-After', String(retryAfterSeconds));
    // What a throttled caller pipelined behind this request is discarded with its connection, unread.
    if (limit === 'rate') exchange.res.setHeader('Connection', 'close');
    reply(
      exchange,
      429,
      limit === 'rate'
        ? 'too many requests from this address'
        : 'too many requests from this address are waiting for its pod',
    );
  };

  const serveCredentialRoute = async (exchange: Exchange, route: CredentialRoute) => {
    // A stale index could name the pod that held this IP before: no answer beats the wrong role.
    const doubt = options.indexDoubt();
    if (doubt !== undefined) return deny(exchange, 503, 'index-stale', doubt);
    // A known caller's lookup ends at once; an unknown caller's waits, and so holds memory until its hold ends.
    const endWait = limits.beginWait(exchange.ip);
    if (!endWait) return throttle(exchange, 'waiting', 1);
    const hold = options.holdFor(exchange.req.headers['user-agent']);
    const identification = await options.broker.identify(exchange.ip, hold.holdMs, exchange.signal).finally(endWait);
    publishWait(exchange, identification, hold);
    if (!identification.identified)
      return answerRefusal(exchange, identification.grant, identification.outcome.waitedMs);
    const { grant, outcome } = identification;
    const waitedMs = outcome.waitedMs;
    if (grant.kind !== 'role') return answerRefusal(exchange, grant, waitedMs);
    const { identity, pod } = grant;
    const roleName = roleNameOf(identity.roleArn);
    switch (route.kind) {
      case 'iam-listing':
        return reply(exchange, 200, IAM_LISTING);
      case 'iam-info':
        return reply(exchange, 200, iamInfoBody(identity.roleArn, new Date()));
      case 'role-name':
        // The SDK asks for the credentials next: start STS now so that request finds them ready.
        prefetch(identity);
        return reply(exchange, 200, roleName);
      case 'credentials':
        if (route.roleName !== roleName) {
          return deny(exchange, 404, 'role-mismatch', `role "${route.roleName}" is not this pod's role`, {
            pod,
            roleArn: identity.roleArn,
            requestedRole: route.roleName,
            waitedMs,
          });
        }
        return serveCredentials(exchange, outcome, grant, route.extended, hold.deadlineMs);
    }
  };

  const answerRefusal = (exchange: Exchange, refusal: Refusal, waitedMs: number) => {
    switch (refusal.kind) {
      case 'retry':
        // A retry for a known pod waits on the base ARN; for an unknown caller, on its pod.
        return deny(exchange, 503, refusal.pod ? 'base-arn-unknown' : 'unknown-pod', refusal.reason, {
          pod: refusal.pod,
          waitedMs,
        });
      case 'no-role':
        return deny(exchange, 404, 'no-role', refusal.reason, { pod: refusal.pod, waitedMs });
      case 'denied':
        return deny(exchange, 403, 'role-denied', refusal.reason, {
          pod: refusal.pod,
          roleArn: refusal.roleArn,
          waitedMs,
        });
    }
  };

  const serveCredentials = async (
    exchange: Exchange,
    outcome: FoundOutcome,
    grant: RoleGrant,
    extended: boolean,
    deadlineMs: number,
  ) => {
    const { identity, pod } = grant;
    try {
      const { credentials, freshness } = await options.credentials(
        identity,
        clientRequest(deadlineMs - outcome.waitedMs),
      );
      publish({
        type: 'credential.issued',
        ...subjectOf(exchange, pod, identity.roleArn),
        source: grant.source,
        resolvedBy: outcome.resolvedBy,
        waitedMs: outcome.waitedMs,
        expiration: credentials.expiration.toISOString(),
        cache: freshness,
      });
      reply(exchange, 200, extended ? extendedCredentialsBody(credentials) : credentialsBody(credentials));
    } catch (error) {
      // Each failed STS attempt is already its own sts.call event; the request's outcome is the denial.
      deny(
        exchange,
        503,
        'sts-failed',
        `could not get credentials for ${identity.roleArn}: ${(error as Error).message}`,
        { pod, roleArn: identity.roleArn, waitedMs: outcome.waitedMs },
      );
    }
  };

  const prefetch = (identity: RoleIdentity) => {
    options
      .credentials(identity, clientRequest())
      .catch((error: unknown) =>
        logger.debug({ roleArn: identity.roleArn, err: String(error) }, 'prefetch after role listing failed'),
      );
  };

  const publishWait = (exchange: Exchange, { outcome, grant }: Identification, hold: ClientHold) => {
    if (outcome.kind === 'found' && outcome.resolvedBy === 'index') return;
    const body: AuditEventBody = {
      type: 'lookup.waited',
      ...subjectOf(exchange, grant.pod, grant.kind === 'role' ? grant.identity.roleArn : undefined),
      waitedMs: outcome.waitedMs,
      outcome: outcome.kind === 'found' ? 'push' : 'retry',
      holdMs: hold.holdMs,
      holdClient: hold.client,
    };
    publish(body);
  };

  const proxy = async (exchange: Exchange) => {
    if (NEVER_PROXIED.test(exchange.path) || !options.allow.test(exchange.path))
      return reply(exchange, 404, `${exchange.path} is not served by this agent`);
    try {
      const response = await options.upstream.get(exchange.path);
      if (exchange.res.headersSent || exchange.res.destroyed) return;
      exchange.res.writeHead(response.status, {
        'Content-Type': response.contentType ?? 'text/plain',
        Server: 'EC2ws',
        'Content-Length': response.body.length,
      });
      exchange.res.end(exchange.req.method === 'HEAD' ? undefined : response.body);
    } catch (error) {
      logger.warn({ path: exchange.path, err: String(error) }, 'upstream metadata service failed');
      reply(exchange, 502, 'the upstream metadata service did not answer');
    }
  };

  const route = async (exchange: Exchange) => {
    const { req } = exchange;
    if (exchange.path === TOKEN_PATH)
      return req.method === 'PUT' ? issueToken(exchange) : reply(exchange, 405, 'use PUT for tokens');
    if (req.method !== 'GET' && req.method !== 'HEAD') return reply(exchange, 405, `method ${req.method} not allowed`);
    const credentialRouteMatch = credentialRoute(exchange.path);
    // A refused credential request is a credential decision: it goes on the audit stream like any other.
    const refuse = (status: number, reason: string) =>
      credentialRouteMatch
        ? deny(exchange, status, 'token', reason, { pod: options.index.ownerOf(exchange.ip) })
        : reply(exchange, status, reason);
    if (req.headers['x-forwarded-for'] !== undefined && req.headers['x-aws-ec2-metadata-token'] !== undefined) {
      return refuse(403, 'requests with a session token through a proxy (X-Forwarded-For) are refused');
    }
    const problem = tokenProblem(exchange);
    if (problem) return refuse(401, problem);
    return credentialRouteMatch ? serveCredentialRoute(exchange, credentialRouteMatch) : proxy(exchange);
  };

  return (req, res) => {
    const aborter = new AbortController();
    // A response that closes before it is finished means the client went away: end its lookup.
    res.on('close', () => {
      if (!res.writableFinished) aborter.abort();
    });
    const rawPath = (req.url ?? '/').split('?')[0] as string;
    const exchange: Exchange = {
      req,
      res,
      ip: callerIp(req),
      requestId: randomUUID(),
      path: rawPath,
      signal: aborter.signal,
    };
    const admission = limits.admit(exchange.ip);
    if (!admission.admitted) return throttle(exchange, 'rate', admission.retryAfterSeconds);
    if (
      rawPath.length > MAX_PATH_LENGTH ||
      !PLAIN_PATH.test(rawPath) ||
      rawPath.split('/').some((segment) => segment === '..' || segment === '.')
    ) {
      return reply(exchange, 400, 'malformed path');
    }
    route(exchange).catch((error: unknown) => {
      if (error instanceof RequestAborted) return;
      logger.error({ err: String(error), path: rawPath, requestId: exchange.requestId }, 'request failed');
      reply(exchange, 500, 'internal error');
    });
  };
}

/** Who a caller is, as the audit events name it. */
export const callerSubject = (ip: string, pod: PodRecord | undefined) => ({
  podIp: ip,
  namespace: pod?.namespace,
  pod: pod?.name,
  serviceAccount: pod?.serviceAccount,
});

/** Pods are indexed by their plain address, as peerAddress gives it. */
export const callerIp = (req: IncomingMessage): string => peerAddress(req.socket);
