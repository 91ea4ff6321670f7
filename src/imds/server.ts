/**
 * The metadata server pods reach through the DNAT rule. Tokens are answered at once; credential
 * paths go through the broker (which may wait for the caller's pod); a short allow-list of other
 * paths is proxied to the node's real metadata service; everything else is refused.
 */
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { AuditEventBody, AuditStream, DenialCause } from '../audit/events.js';
import { type Broker, type Identification, RequestAborted } from '../broker/broker.js';
import type { IndexView } from '../broker/pod-index.js';
import type { LookupOutcome } from '../broker/lookup.js';
import { type Grant, type RoleIdentity, roleNameOf } from '../broker/policy.js';
import type { PodRecord } from '../cluster/pods.js';
import type { CredentialCache } from '../credentials/cache.js';
import { type TokenIssuer, parseTtlHeader } from './tokens.js';
import type { Upstream } from './upstream.js';
import { IAM_LISTING, credentialsBody, extendedCredentialsBody, iamInfoBody } from './wire.js';

export interface ImdsServerOptions {
  readonly broker: Broker;
  readonly index: IndexView;
  readonly credentials: CredentialCache;
  /** The longest a credential request is held in all (grace-window wait plus STS). */
  readonly credentialDeadlineMs: number;
  readonly tokens: TokenIssuer;
  readonly tokensRequired: boolean;
  readonly upstream: Upstream;
  /** Anchored allow-list of paths proxied to the upstream. */
  readonly allow: RegExp;
  readonly audit: AuditStream;
  readonly logger: Logger;
}

type RoleGrant = Extract<Grant, { kind: 'role' }>;

type CredentialRoute =
  | { readonly kind: 'role-name'; readonly extended: boolean }
  | { readonly kind: 'credentials'; readonly extended: boolean; readonly roleName: string }
  | { readonly kind: 'iam-info' }
  | { readonly kind: 'iam-listing' };

const TOKEN_PATH = '/latest/api/token';
const CREDENTIAL_PATH = /^\/latest\/meta-data\/iam\/security-credentials(-extended)?(?:\/([\w+=,.@-]*))?$/;
/** Paths that carry the node's credentials are never proxied, whatever the allow-list says. */
const NEVER_PROXIED = /^\/[^/]+\/meta-data\/(iam|identity-credentials)(\/|$)/;
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
  const { audit, logger } = options;

  const reply = (exchange: Exchange, status: number, body: string) => {
    if (exchange.res.headersSent || exchange.res.destroyed) return;
    exchange.res.writeHead(status, { 'Content-Type': 'text/plain', Server: 'EC2ws', 'X-Request-Id': exchange.requestId, 'Content-Length': Buffer.byteLength(body) });
    exchange.res.end(exchange.req.method === 'HEAD' ? undefined : body);
  };

  const subjectOf = (exchange: Exchange, pod: PodRecord | undefined, roleArn?: string) => ({
    requestId: exchange.requestId,
    podIp: exchange.ip,
    namespace: pod?.namespace,
    pod: pod?.name,
    serviceAccount: pod?.serviceAccount,
    roleArn,
  });

  const deny = (exchange: Exchange, status: number, cause: DenialCause, reason: string, details: { pod?: PodRecord; roleArn?: string; requestedRole?: string; waitedMs?: number } = {}) => {
    audit.publish({
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
      audit.publish({ type: 'token.refused', ...subjectOf(exchange, options.index.ownerOf(exchange.ip)), reason });
      reply(exchange, status, reason);
    };
    // Real EC2 refuses token requests that went through a proxy, so a forwarded request cannot mint one.
    if (exchange.req.headers['x-forwarded-for'] !== undefined) return refuse(403, 'token requests through a proxy (X-Forwarded-For) are refused');
    const ttl = parseTtlHeader(exchange.req.headers['x-aws-ec2-metadata-token-ttl-seconds']);
    if (!ttl.ok) return refuse(400, ttl.reason);
    const token = options.tokens.issue(exchange.ip, ttl.ttlSeconds);
    audit.publish({ type: 'token.issued', ...subjectOf(exchange, options.index.ownerOf(exchange.ip)), ttlSeconds: ttl.ttlSeconds });
    exchange.res.setHeader('X-Aws-Ec2-Metadata-Token-Ttl-Seconds', String(ttl.ttlSeconds));
    reply(exchange, 200, token);
  };

  /** 401 for a missing token where tokens are required, and for a bad token always (as EC2 does). */
  const tokenProblem = (exchange: Exchange): string | undefined => {
    const token = exchange.req.headers['x-aws-ec2-metadata-token'];
    if (token === undefined) return options.tokensRequired ? 'a session token is required (PUT /latest/api/token first)' : undefined;
    const check = options.tokens.verify(token, exchange.ip);
    return check.valid ? undefined : `invalid session token: ${check.reason}`;
  };

  const serveCredentialRoute = async (exchange: Exchange, route: CredentialRoute) => {
    const identification = await options.broker.identify(exchange.ip, exchange.signal);
    publishWait(exchange, identification);
    const { grant, outcome } = identification;
    const waitedMs = outcome.waitedMs;
    // A retry for a known pod waits on the base ARN; for an unknown caller, on its pod.
    if (grant.kind === 'retry') return deny(exchange, 503, grant.pod ? 'base-arn-unknown' : 'unknown-pod', grant.reason, { pod: grant.pod, waitedMs });
    if (grant.kind === 'no-role') return deny(exchange, 404, 'no-role', grant.reason, { pod: grant.pod, waitedMs });
    if (grant.kind === 'denied') return deny(exchange, 403, 'role-denied', grant.reason, { pod: grant.pod, roleArn: grant.roleArn, waitedMs });
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
          return deny(exchange, 404, 'role-mismatch', `role "${route.roleName}" is not this pod's role`, { pod, roleArn: identity.roleArn, requestedRole: route.roleName, waitedMs });
        }
        return serveCredentials(exchange, outcome, grant, route.extended);
    }
  };

  const serveCredentials = async (exchange: Exchange, outcome: LookupOutcome, grant: RoleGrant, extended: boolean) => {
    const { identity, pod } = grant;
    try {
      const { credentials, freshness } = await options.credentials.get(identity, options.credentialDeadlineMs - outcome.waitedMs);
      audit.publish({
        type: 'credential.issued',
        ...subjectOf(exchange, pod, identity.roleArn),
        source: grant.source,
        resolvedBy: outcome.kind === 'found' ? outcome.resolvedBy : 'grace-window',
        waitedMs: outcome.waitedMs,
        expiration: credentials.expiration.toISOString(),
        cache: freshness,
      });
      reply(exchange, 200, extended ? extendedCredentialsBody(credentials) : credentialsBody(credentials));
    } catch (error) {
      // Each failed STS attempt is already its own sts.call event; the request's outcome is the denial.
      deny(exchange, 503, 'sts-failed', `could not get credentials for ${identity.roleArn}: ${(error as Error).message}`, { pod, roleArn: identity.roleArn, waitedMs: outcome.waitedMs });
    }
  };

  const prefetch = (identity: RoleIdentity) => {
    options.credentials.get(identity).catch((error: unknown) => logger.debug({ roleArn: identity.roleArn, err: String(error) }, 'prefetch after role listing failed'));
  };

  const publishWait = (exchange: Exchange, { outcome, grant }: Identification) => {
    if (outcome.kind === 'found' && outcome.resolvedBy === 'index') return;
    const body: AuditEventBody = {
      type: 'lookup.waited',
      ...subjectOf(exchange, grant.pod, grant.kind === 'role' ? grant.identity.roleArn : undefined),
      waitedMs: outcome.waitedMs,
      outcome: outcome.kind === 'found' ? 'push' : grant.kind === 'role' ? 'default-role' : 'retry',
    };
    audit.publish(body);
  };

  const proxy = async (exchange: Exchange) => {
    if (NEVER_PROXIED.test(exchange.path) || !options.allow.test(exchange.path)) return reply(exchange, 404, `${exchange.path} is not served by this agent`);
    try {
      const response = await options.upstream.get(exchange.path);
      if (exchange.res.headersSent || exchange.res.destroyed) return;
      exchange.res.writeHead(response.status, { 'Content-Type': response.contentType ?? 'text/plain', Server: 'EC2ws', 'Content-Length': response.body.length });
      exchange.res.end(exchange.req.method === 'HEAD' ? undefined : response.body);
    } catch (error) {
      logger.warn({ path: exchange.path, err: String(error) }, 'upstream metadata service failed');
      reply(exchange, 502, 'the upstream metadata service did not answer');
    }
  };

  const route = async (exchange: Exchange) => {
    const { req } = exchange;
    if (exchange.path === TOKEN_PATH) return req.method === 'PUT' ? issueToken(exchange) : reply(exchange, 405, 'use PUT for tokens');
    if (req.method !== 'GET' && req.method !== 'HEAD') return reply(exchange, 405, `method ${req.method} not allowed`);
    const credentialRouteMatch = credentialRoute(exchange.path);
    // A refused credential request is a credential decision: it goes on the audit stream like any other.
    const refuse = (status: number, reason: string) =>
      credentialRouteMatch ? deny(exchange, status, 'token', reason, { pod: options.index.ownerOf(exchange.ip) }) : reply(exchange, status, reason);
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
    const exchange: Exchange = { req, res, ip: callerIp(req), requestId: randomUUID(), path: rawPath, signal: aborter.signal };
    if (rawPath.length > MAX_PATH_LENGTH || !PLAIN_PATH.test(rawPath) || rawPath.split('/').some((segment) => segment === '..' || segment === '.')) {
      return reply(exchange, 400, 'malformed path');
    }
    route(exchange).catch((error: unknown) => {
      if (error instanceof RequestAborted) return;
      logger.error({ err: String(error), path: rawPath, requestId: exchange.requestId }, 'request failed');
      reply(exchange, 500, 'internal error');
    });
  };
}

/** IPv4 callers reach a dual-stack socket as ::ffff:a.b.c.d; pods are indexed by the plain address. */
export const callerIp = (req: IncomingMessage): string => (req.socket.remoteAddress ?? '').replace(/^::ffff:/, '');
