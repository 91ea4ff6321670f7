/**
 * The admin server, on its own port (loopback by default) so pods cannot reach it: liveness,
 * readiness (the informers have synced and are watching), the audit stream and the index for
 * debugging. Metrics have their own listener (src/admin/metrics.ts), which Prometheus may reach.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { PodIndex } from '../broker/pod-index.js';
import { isProtectedAdminPath } from './auth.js';

export interface AdminOptions {
  readonly index: PodIndex;
  /** GET /events: the audit stream (src/audit/sse.ts). */
  readonly events: (req: IncomingMessage, res: ServerResponse) => void;
  /** Whether a request may read /events and /debug/* (src/admin/auth.ts). */
  readonly authorized: (req: IncomingMessage) => boolean;
}

export interface Readiness {
  readonly ready: boolean;
  readonly informers: Record<string, { synced: boolean; watching: boolean; lastError?: string }>;
}

export function readiness(index: PodIndex): Readiness {
  const informers = {
    pods: index.health('pods'),
    namespaces: index.health('namespaces'),
    serviceaccounts: index.health('serviceaccounts'),
  };
  const ready = Object.values(informers).every((health) => health.synced && health.watching);
  return { ready, informers };
}

export function adminHandler(options: AdminOptions): (req: IncomingMessage, res: ServerResponse) => void {
  const json = (res: ServerResponse, status: number, body: unknown) => {
    const text = JSON.stringify(body);
    res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
    res.end(text);
  };
  return (req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD')
      return json(res, 405, { error: `method ${req.method} not allowed` });
    if (isProtectedAdminPath(path as string) && !options.authorized(req)) {
      res.setHeader('WWW-Authenticate', 'Bearer');
      return json(res, 401, { error: 'a bearer token (BROKER_ADMIN_TOKEN) is required' });
    }
    switch (path) {
      case '/healthz':
        return json(res, 200, { status: 'ok' });
      case '/readyz': {
        const state = readiness(options.index);
        return json(res, state.ready ? 200 : 503, state);
      }
      case '/debug/pods':
        return json(res, 200, {
          pods: options.index.podCount(),
          owners: Object.fromEntries(
            [...options.index.owners()].map(([ip, pod]) => [
              ip,
              { namespace: pod.namespace, pod: pod.name, uid: pod.uid },
            ]),
          ),
        });
      case '/events':
        return options.events(req, res);
      default:
        return json(res, 404, { error: `${path} not found` });
    }
  };
}
