/**
 * Who may read the audit stream and the debug pages. Pods must not: the admin server listens on
 * loopback by default, and anywhere else a bearer token is required.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { isIP } from 'node:net';
import { ConfigError } from '../config/load.js';
import { peerAddress, splitHostPort } from '../http/listen.js';

/** Paths that reveal which pod has which role; probes (/healthz, /readyz) stay open for the kubelet. */
export const isProtectedAdminPath = (path: string): boolean => path === '/events' || path.startsWith('/debug/');

/** The host part of host:port is a loopback address (127.0.0.0/8, ::1) or localhost. */
export function isLoopbackListen(hostPort: string): boolean {
  const { host } = splitHostPort(hostPort);
  if (host === 'localhost') return true;
  return isLoopbackPeer(host);
}

/** Refuses a configuration that would let pods read the audit stream. */
export function assertAdminProtected(adminListen: string, token: string | undefined): void {
  if (token === undefined && !isLoopbackListen(adminListen)) {
    throw new ConfigError([
      `BROKER_ADMIN_LISTEN (--admin-listen) is ${adminListen}, not a loopback address: set BROKER_ADMIN_TOKEN so that pods cannot read /events and /debug/*`,
    ]);
  }
}

const digest = (text: string): Buffer => createHash('sha256').update(text).digest();

/** A loopback peer address: 127.0.0.0/8 or ::1 (IPv4 peers of a dual-stack socket included). */
export const isLoopbackPeer = (address: string): boolean =>
  address === '::1' || (isIP(address) === 4 && address.startsWith('127.'));

/**
 * A check of `Authorization: Bearer <token>`. Both sides are hashed first so the comparison takes
 * the same time whatever the length or content of the guess. Without a token only loopback peers
 * are allowed (the listener is loopback, as assertAdminProtected ensured): a pod that reaches the
 * node's 127.0.0.1 through route_localnet (CVE-2020-8558) still sends from its own address.
 */
export function bearerAuthorizer(token: string | undefined): (req: IncomingMessage) => boolean {
  if (token === undefined) return (req) => isLoopbackPeer(peerAddress(req.socket));
  const expected = digest(token);
  return (req) => {
    const match = /^Bearer (.+)$/.exec(req.headers.authorization ?? '');
    return timingSafeEqual(digest(match?.[1] ?? ''), expected);
  };
}
