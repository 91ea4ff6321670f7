/** Requests to routes: a path pattern and a method each, with 404 and 405 as the API server answers them. */
import type { ServerResponse } from 'node:http';
import { ApiError } from './status.js';

export interface RequestContext {
  readonly method: string;
  readonly query: URLSearchParams;
  readonly contentType: string;
  readonly body: unknown;
  readonly res: ServerResponse;
}

/** What a route handler produces; `undefined` means it took over the response (a watch). */
export type Reply = { status: number; body: unknown } | undefined;

export interface Route {
  readonly method: string;
  readonly pattern: RegExp;
  /** Receives the pattern's capture groups, URI-decoded; no route has more than two. */
  readonly handle: (ctx: RequestContext, params: [string, string]) => Reply;
}

export function dispatch(routes: readonly Route[], ctx: RequestContext, path: string): Reply {
  let pathKnown = false;
  for (const route of routes) {
    const match = route.pattern.exec(path);
    if (!match) continue;
    pathKnown = true;
    if (route.method === ctx.method) {
      return route.handle(ctx, match.slice(1).map(decodeURIComponent) as [string, string]);
    }
  }
  if (pathKnown) throw new ApiError(405, `method ${ctx.method} is not supported on ${path}`);
  throw new ApiError(404, `the server could not find the requested resource (${path})`);
}

export function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
}
