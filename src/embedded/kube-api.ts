/**
 * A wire-level fake of the Kubernetes API server, small enough to embed.
 *
 * It speaks the subset of the real protocol the broker relies on (discovery,
 * list, chunked JSON watches with resourceVersion replay, node PATCH, event
 * creation) so that the real `kubectl` binary and `@kubernetes/client-node`
 * can talk to it unmodified. State lives in memory and is driven from code
 * (`upsertPod`, `deleteNamespace`, ...); faults such as compaction, dropped
 * watches, failing requests and a down server are injected on demand.
 */
import { randomUUID } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { createServer, STATUS_CODES } from 'node:http';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { readBody } from '../http/body.js';

export interface FakeKubeApiOptions {
  host?: string;
  port?: number;
}

export interface ObjectMeta {
  name: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  creationTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  [field: string]: unknown;
}

/** Metadata as stored: the server has filled in identity and version. */
export interface StoredMeta extends ObjectMeta {
  uid: string;
  resourceVersion: string;
  creationTimestamp: string;
}

export interface Taint {
  key: string;
  value?: string;
  effect: string;
  timeAdded?: string;
}

export interface PodInput {
  metadata: ObjectMeta;
  spec?: { nodeName?: string; hostNetwork?: boolean; serviceAccountName?: string; [field: string]: unknown };
  status?: { phase?: string; podIP?: string; podIPs?: Array<{ ip: string }>; [field: string]: unknown };
}

export interface Pod extends PodInput {
  apiVersion: 'v1';
  kind: 'Pod';
  metadata: StoredMeta & { namespace: string };
}

export interface NamespaceInput {
  metadata: ObjectMeta;
  spec?: Record<string, unknown>;
  status?: Record<string, unknown>;
}

export interface Namespace extends NamespaceInput {
  apiVersion: 'v1';
  kind: 'Namespace';
  metadata: StoredMeta;
}

export interface NodeInput {
  metadata: ObjectMeta;
  spec?: { taints?: Taint[]; [field: string]: unknown };
  status?: Record<string, unknown>;
}

export interface Node extends NodeInput {
  apiVersion: 'v1';
  kind: 'Node';
  metadata: StoredMeta;
}

export interface RecordedRequest {
  method: string;
  path: string;
  query: Record<string, string>;
  body?: unknown;
}

type ResourceName = 'pods' | 'namespaces' | 'nodes';
type ChangeType = 'ADDED' | 'MODIFIED' | 'DELETED';

interface StoredObject {
  apiVersion: string;
  kind: string;
  metadata: StoredMeta;
  [field: string]: unknown;
}

interface ObjectInput {
  metadata: ObjectMeta;
}

/** One committed state change, kept so that watches can replay it. */
interface Change {
  resource: ResourceName;
  type: ChangeType;
  rv: number;
  object: StoredObject;
  /** State before a MODIFIED change: decides ADDED/DELETED for selector watches. */
  previous?: StoredObject;
}

interface WatchEvent {
  type: ChangeType | 'ERROR' | 'BOOKMARK';
  object: unknown;
}

interface Watcher {
  resource: ResourceName;
  matches: Predicate;
  /** Only changes newer than this are sent (the watch's resourceVersion). */
  since: number;
  res: ServerResponse;
}

type Predicate = (object: StoredObject) => boolean;

/** What a route handler produces; `undefined` means it took over the response (a watch). */
type Reply = { status: number; body: unknown } | undefined;

interface RequestContext {
  method: string;
  query: URLSearchParams;
  contentType: string;
  body: unknown;
  res: ServerResponse;
}

interface Route {
  method: string;
  pattern: RegExp;
  /** Receives the pattern's capture groups, URI-decoded; no route has more than two. */
  handle: (ctx: RequestContext, params: [string, string]) => Reply;
}

const RESOURCES: Record<ResourceName, { kind: string; namespaced: boolean; shortName: string; verbs: string[] }> = {
  pods: { kind: 'Pod', namespaced: true, shortName: 'po', verbs: ['get', 'list', 'watch'] },
  namespaces: { kind: 'Namespace', namespaced: false, shortName: 'ns', verbs: ['get', 'list', 'watch'] },
  nodes: { kind: 'Node', namespaced: false, shortName: 'no', verbs: ['get', 'list', 'watch', 'patch'] },
};

const EVENTS_GROUP_VERSION = 'events.k8s.io/v1';
/** Replayable history length; older resourceVersions become "too old" like after an etcd compaction. */
const MAX_HISTORY = 10_000;
/** Caps on the assertion logs so a long-running embedded demo does not grow without bound. */
const MAX_LOGGED = 10_000;
const MAX_BODY_BYTES = 1024 * 1024;

const STATUS_REASONS: Record<number, string> = {
  400: 'BadRequest',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  409: 'Conflict',
  410: 'Expired',
  413: 'RequestEntityTooLarge',
  415: 'UnsupportedMediaType',
  422: 'Invalid',
  429: 'TooManyRequests',
  500: 'InternalError',
  503: 'ServiceUnavailable',
  504: 'Timeout',
};

/** An error that maps onto a v1 Status response. */
class ApiError extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

function statusBody(code: number, message: string): Record<string, unknown> {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason: STATUS_REASONS[code] ?? 'Unknown',
    code,
  };
}

export class FakeKubeApi {
  readonly requests: RecordedRequest[] = [];
  readonly createdEvents: unknown[] = [];

  private readonly server: Server;
  private readonly host: string;
  private port: number;
  private readonly sockets = new Set<Socket>();
  private readonly watchers = new Set<Watcher>();
  private readonly store: Record<ResourceName, Map<string, StoredObject>> = {
    pods: new Map(),
    namespaces: new Map(),
    nodes: new Map(),
  };
  private readonly history: Change[] = [];
  /** Starts above 0 because "0" means "any version" in the protocol; a list must never return it. */
  private resourceVersion = 1;
  /** Watches starting at or below this resourceVersion get 410 Expired. */
  private expiredThrough = 0;
  private pendingFailures: { count: number; status: number } = { count: 0, status: 500 };
  private listening = false;
  private readonly routes: Route[];

  private constructor(host: string, port: number) {
    this.host = host;
    this.port = port;
    this.routes = this.buildRoutes();
    this.server = createServer((req, res) => void this.handle(req, res));
    this.server.on('connection', (socket) => this.trackSocket(socket));
  }

  static async start(options: FakeKubeApiOptions = {}): Promise<FakeKubeApi> {
    const api = new FakeKubeApi(options.host ?? '127.0.0.1', options.port ?? 0);
    await api.listen();
    return api;
  }

  get url(): string {
    return `http://${this.host}:${this.port}`;
  }

  writeKubeconfig(dir: string): string {
    const path = join(dir, 'kubeconfig');
    writeFileSync(path, this.kubeconfigText(), { mode: 0o600 });
    return path;
  }

  /** A kubeconfig for this server, for KubeConfig.loadFromString or a file. */
  kubeconfigText(): string {
    // JSON is valid YAML, and both kubectl and client-node accept it. client-node refuses plain
    // http unless insecure-skip-tls-verify is set, even though there is no TLS to verify.
    const kubeconfig = {
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'fake', cluster: { server: this.url, 'insecure-skip-tls-verify': true } }],
      users: [{ name: 'fake', user: {} }],
      contexts: [{ name: 'fake', context: { cluster: 'fake', user: 'fake', namespace: 'default' } }],
      'current-context': 'fake',
    };
    return JSON.stringify(kubeconfig, null, 2);
  }

  // ---- state ----------------------------------------------------------------

  upsertPod(pod: PodInput): Pod {
    const metadata = { ...pod.metadata, namespace: pod.metadata.namespace ?? 'default' };
    return this.put('pods', { ...pod, metadata }) as Pod;
  }

  deletePod(namespace: string, name: string): Pod | undefined {
    return this.remove('pods', `${namespace}/${name}`) as Pod | undefined;
  }

  upsertNamespace(ns: NamespaceInput): Namespace {
    return this.put('namespaces', { status: { phase: 'Active' }, ...ns }) as Namespace;
  }

  deleteNamespace(name: string): void {
    this.remove('namespaces', name);
  }

  upsertNode(node: NodeInput): Node {
    return this.put('nodes', node) as Node;
  }

  getNode(name: string): Node | undefined {
    const node = this.store.nodes.get(name);
    return node && (structuredClone(node) as Node);
  }

  pods(): Pod[] {
    return this.sortedObjects('pods').map((pod) => structuredClone(pod) as Pod);
  }

  // ---- faults ---------------------------------------------------------------

  /** Destroys every watch socket mid-stream, as a network cut would. */
  dropWatches(): void {
    for (const watcher of this.watchers) watcher.res.destroy();
  }

  /** Ends every watch with a proper final chunk, as the API server's watch timeout does. */
  endWatches(): void {
    for (const watcher of this.watchers) watcher.res.end();
  }

  compact(): void {
    this.expiredThrough = this.resourceVersion;
    // Nothing recorded so far can be replayed any more.
    this.history.length = 0;
    // Advance past the compaction point so a relist gets a resourceVersion that can be watched,
    // otherwise clients would loop between list and "too old".
    this.resourceVersion += 1;
    for (const watcher of this.watchers) this.expire(watcher.res);
  }

  /**
   * An etcd compaction that keeps the changes after throughRv: watches from an older
   * resourceVersion get 410, watches already streaming go on (unlike compact(), which expires all).
   */
  compactThrough(throughRv: number): void {
    this.expiredThrough = Math.max(this.expiredThrough, throughRv);
    const kept = this.history.filter((change) => change.rv > throughRv);
    this.history.length = 0;
    this.history.push(...kept);
  }

  /** The resourceVersion of the latest change. */
  get currentResourceVersion(): number {
    return this.resourceVersion;
  }

  failRequests(count: number, status = 500): void {
    this.pendingFailures = { count, status };
  }

  async setDown(down: boolean): Promise<void> {
    if (down) await this.closeListener();
    else await this.listen();
  }

  async stop(): Promise<void> {
    await this.closeListener();
  }

  // ---- lifecycle ------------------------------------------------------------

  private async listen(): Promise<void> {
    if (this.listening) return;
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.port, this.host, () => {
        this.server.off('error', reject);
        resolve();
      });
    });
    // Remember the port picked for port 0 so setDown(false) comes back on the same address.
    this.port = (this.server.address() as AddressInfo).port;
    this.listening = true;
  }

  private async closeListener(): Promise<void> {
    if (!this.listening) return;
    this.listening = false;
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    // close() only stops accepting; keep-alive and watch connections would keep it open forever.
    for (const socket of this.sockets) socket.destroy();
    await closed;
  }

  private trackSocket(socket: Socket): void {
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
  }

  // ---- store ----------------------------------------------------------------

  private put(resource: ResourceName, input: ObjectInput): StoredObject {
    const key = objectKey(resource, input.metadata);
    const previous = this.store[resource].get(key);
    const rv = ++this.resourceVersion;
    const copy = structuredClone(input);
    const object: StoredObject = {
      ...copy,
      apiVersion: 'v1',
      kind: RESOURCES[resource].kind,
      metadata: {
        ...copy.metadata,
        uid: copy.metadata.uid ?? previous?.metadata.uid ?? randomUUID(),
        creationTimestamp: copy.metadata.creationTimestamp ?? previous?.metadata.creationTimestamp ?? nowIso(),
        resourceVersion: String(rv),
      },
    };
    this.store[resource].set(key, object);
    this.commit({ resource, type: previous ? 'MODIFIED' : 'ADDED', rv, object, previous });
    return structuredClone(object);
  }

  private remove(resource: ResourceName, key: string): StoredObject | undefined {
    const last = this.store[resource].get(key);
    if (!last) return undefined;
    this.store[resource].delete(key);
    const rv = ++this.resourceVersion;
    const object = withResourceVersion(last, rv);
    this.commit({ resource, type: 'DELETED', rv, object });
    return structuredClone(object);
  }

  /** Stored objects are never mutated in place, so history and watchers can share them. */
  private commit(change: Change): void {
    this.history.push(change);
    if (this.history.length > MAX_HISTORY) {
      const evicted = this.history.shift() as Change;
      this.expiredThrough = Math.max(this.expiredThrough, evicted.rv - 1);
    }
    for (const watcher of this.watchers) this.deliver(watcher, change);
  }

  private sortedObjects(resource: ResourceName): StoredObject[] {
    return [...this.store[resource].entries()].sort(([a], [b]) => a.localeCompare(b)).map(([, object]) => object);
  }

  // ---- HTTP -----------------------------------------------------------------

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      const url = new URL(req.url ?? '/', 'http://fake');
      const method = req.method ?? 'GET';
      const raw = await readBody(req, MAX_BODY_BYTES, () => new ApiError(413, 'request body too large'));
      this.log({ method, path: url.pathname, query: Object.fromEntries(url.searchParams), ...loggedBody(raw) });
      this.injectFailure();
      const ctx: RequestContext = {
        method,
        query: url.searchParams,
        contentType: (req.headers['content-type'] ?? '').split(';')[0]?.trim() ?? '',
        body: method === 'POST' || method === 'PATCH' ? parseJsonBody(raw) : undefined,
        res,
      };
      const reply = this.route(ctx, url.pathname);
      if (reply) sendJson(res, reply.status, reply.body);
    } catch (error) {
      const code = error instanceof ApiError ? error.code : 500;
      if (!res.headersSent) sendJson(res, code, statusBody(code, (error as Error).message));
      else res.destroy();
    }
  }

  private log(entry: RecordedRequest): void {
    pushBounded(this.requests, entry);
  }

  private injectFailure(): void {
    if (this.pendingFailures.count <= 0) return;
    this.pendingFailures.count -= 1;
    const { status } = this.pendingFailures;
    throw new ApiError(status, `injected failure: ${STATUS_CODES[status] ?? status}`);
  }

  private route(ctx: RequestContext, path: string): Reply {
    let pathKnown = false;
    for (const route of this.routes) {
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

  private buildRoutes(): Route[] {
    const discovery = (body: unknown) => () => ({ status: 200, body });
    return [
      { method: 'GET', pattern: /^\/version$/, handle: discovery(VERSION) },
      { method: 'GET', pattern: /^\/api$/, handle: () => ({ status: 200, body: this.apiVersions() }) },
      { method: 'GET', pattern: /^\/apis$/, handle: discovery(API_GROUP_LIST) },
      { method: 'GET', pattern: /^\/api\/v1$/, handle: discovery(CORE_RESOURCES) },
      { method: 'GET', pattern: /^\/apis\/events\.k8s\.io\/v1$/, handle: discovery(EVENTS_RESOURCES) },
      {
        method: 'POST',
        pattern: /^\/api\/v1\/namespaces\/([^/]+)\/events$/,
        handle: (ctx, [ns]) => this.createEvent(ctx.body, ns, 'v1'),
      },
      {
        method: 'POST',
        pattern: /^\/apis\/events\.k8s\.io\/v1\/namespaces\/([^/]+)\/events$/,
        handle: (ctx, [ns]) => this.createEvent(ctx.body, ns, EVENTS_GROUP_VERSION),
      },
      {
        method: 'GET',
        pattern: /^\/api\/v1\/(pods|namespaces|nodes)$/,
        handle: (ctx, [resource]) => this.collection(ctx, resource as ResourceName),
      },
      {
        method: 'GET',
        pattern: /^\/api\/v1\/namespaces\/([^/]+)\/pods$/,
        handle: (ctx, [ns]) => this.collection(ctx, 'pods', ns),
      },
      {
        method: 'GET',
        pattern: /^\/api\/v1\/namespaces\/([^/]+)\/pods\/([^/]+)$/,
        handle: (_ctx, [ns, name]) => this.getObject('pods', `${ns}/${name}`),
      },
      {
        method: 'GET',
        pattern: /^\/api\/v1\/(namespaces|nodes)\/([^/]+)$/,
        handle: (_ctx, [resource, name]) => this.getObject(resource as ResourceName, name),
      },
      {
        method: 'PATCH',
        pattern: /^\/api\/v1\/nodes\/([^/]+)$/,
        handle: (ctx, [name]) => this.patchNode(ctx, name),
      },
    ];
  }

  private apiVersions(): unknown {
    return {
      kind: 'APIVersions',
      versions: ['v1'],
      serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: `${this.host}:${this.port}` }],
    };
  }

  private getObject(resource: ResourceName, key: string): Reply {
    const object = this.store[resource].get(key);
    if (!object) throw new ApiError(404, `${resource} "${key.split('/').pop()}" not found`);
    return { status: 200, body: object };
  }

  private collection(ctx: RequestContext, resource: ResourceName, namespace?: string): Reply {
    const matches = objectPredicate(ctx.query, namespace);
    if (isWatchRequest(ctx.query)) {
      this.startWatch(ctx, resource, matches);
      return undefined;
    }
    // limit/continue are ignored: returning everything without a continue token is a valid answer.
    return {
      status: 200,
      body: {
        kind: `${RESOURCES[resource].kind}List`,
        apiVersion: 'v1',
        metadata: { resourceVersion: String(this.resourceVersion) },
        items: this.sortedObjects(resource).filter(matches),
      },
    };
  }

  private createEvent(body: unknown, namespace: string, apiVersion: string): Reply {
    if (!isPlainObject(body)) throw new ApiError(400, 'event body must be a JSON object');
    const metadata = isPlainObject(body.metadata) ? body.metadata : {};
    const prefix = typeof metadata.generateName === 'string' ? metadata.generateName : 'event.';
    const name = typeof metadata.name === 'string' ? metadata.name : `${prefix}${randomUUID()}`;
    const event = {
      ...body,
      apiVersion,
      kind: 'Event',
      metadata: {
        ...metadata,
        name,
        namespace,
        uid: randomUUID(),
        resourceVersion: String(++this.resourceVersion),
        creationTimestamp: nowIso(),
      },
    };
    pushBounded(this.createdEvents, event);
    return { status: 201, body: event };
  }

  private patchNode(ctx: RequestContext, name: string): Reply {
    const current = this.store.nodes.get(name);
    if (!current) throw new ApiError(404, `nodes "${name}" not found`);
    const patched = applyPatch(current, ctx.contentType, ctx.body);
    validateNode(patched);
    // Identity fields are immutable; a patch cannot rename or re-create the node.
    const { uid, creationTimestamp } = current.metadata;
    const pinned = { ...patched, metadata: { ...patched.metadata, name, uid, creationTimestamp } };
    return { status: 200, body: this.put('nodes', pinned) };
  }

  // ---- watches --------------------------------------------------------------

  private startWatch(ctx: RequestContext, resource: ResourceName, matches: Predicate): void {
    const requested = parseResourceVersion(ctx.query.get('resourceVersion'));
    const { res } = ctx;
    res.writeHead(200, {
      'Content-Type': 'application/json',
      'Transfer-Encoding': 'chunked',
      'Cache-Control': 'no-cache',
    });
    // Clients consider the watch established once headers arrive; don't wait for the first event.
    res.flushHeaders();
    if (requested !== undefined && requested <= this.expiredThrough) {
      this.expire(res);
      return;
    }
    const watcher: Watcher = { resource, matches, since: requested ?? this.resourceVersion, res };
    for (const change of this.history) this.deliver(watcher, change);
    this.watchers.add(watcher);
    const timeout = watchTimeoutMs(ctx.query);
    // As kube-apiserver's watch cache does for clients that allow bookmarks: the resourceVersion
    // the watch has reached, sent just before it ends at its timeout, so the next watch resumes
    // from there even when nothing this watch selects changed (a quiet node's pods).
    const bookmarks = ctx.query.get('allowWatchBookmarks') === 'true';
    const end = () => {
      if (bookmarks) writeEvent(res, { type: 'BOOKMARK', object: { kind: RESOURCES[resource].kind, apiVersion: 'v1', metadata: { resourceVersion: String(this.resourceVersion) } } });
      res.end();
    };
    const timer = timeout === undefined ? undefined : setTimeout(end, timeout);
    res.once('close', () => {
      clearTimeout(timer);
      this.watchers.delete(watcher);
    });
  }

  /** Real API servers answer a too-old watch with HTTP 200 and an in-stream 410, then close. */
  private expire(res: ServerResponse): void {
    writeEvent(res, { type: 'ERROR', object: statusBody(410, 'too old resource version') });
    res.end();
  }

  private deliver(watcher: Watcher, change: Change): void {
    if (change.resource !== watcher.resource || change.rv <= watcher.since) return;
    const event = eventForWatcher(change, watcher.matches);
    if (event) writeEvent(watcher.res, event);
  }
}

// ---- watch helpers ------------------------------------------------------------

/**
 * Translates a change into what a selector-filtered watch sees, as the real
 * watch cache does: an object moving into the selection is ADDED, one moving
 * out of it is DELETED (its last matching state at the new resourceVersion).
 */
function eventForWatcher(change: Change, matches: Predicate): WatchEvent | undefined {
  const matchesNow = matches(change.object);
  if (change.type !== 'MODIFIED') return matchesNow ? { type: change.type, object: change.object } : undefined;
  const matchedBefore = change.previous !== undefined && matches(change.previous);
  if (matchesNow) return { type: matchedBefore ? 'MODIFIED' : 'ADDED', object: change.object };
  if (!matchedBefore) return undefined;
  return { type: 'DELETED', object: withResourceVersion(change.previous as StoredObject, change.rv) };
}

function writeEvent(res: ServerResponse, event: WatchEvent): void {
  if (!res.writableEnded) res.write(`${JSON.stringify(event)}\n`);
}

function isWatchRequest(query: URLSearchParams): boolean {
  const watch = query.get('watch');
  return watch === 'true' || watch === '1';
}

/** "", "0" or absent (undefined) mean "from now": such a watch can never be too old. */
function parseResourceVersion(value: string | null): number | undefined {
  if (value === null || value === '' || value === '0') return undefined;
  if (!/^\d+$/.test(value)) throw new ApiError(400, `invalid resource version: ${value}`);
  return Number(value);
}

function watchTimeoutMs(query: URLSearchParams): number | undefined {
  const value = query.get('timeoutSeconds');
  if (value === null) return undefined;
  const seconds = Number(value);
  if (!Number.isFinite(seconds) || seconds < 0) throw new ApiError(400, `invalid timeoutSeconds: ${value}`);
  return seconds * 1000;
}

// ---- selectors ----------------------------------------------------------------

function objectPredicate(query: URLSearchParams, namespace: string | undefined): Predicate {
  const fields = parseSelector(query.get('fieldSelector'), 'field');
  const labels = parseSelector(query.get('labelSelector'), 'label');
  return (object) =>
    (namespace === undefined || object.metadata.namespace === namespace) &&
    fields.every((term) => term(fieldValue(object, term.key))) &&
    labels.every((term) => term(object.metadata.labels?.[term.key]));
}

type SelectorTerm = ((value: string | undefined) => boolean) & { key: string };

/**
 * Parses the equality-based selector grammar shared by field and label
 * selectors (`k=v`, `k==v`, `k!=v`, comma-joined); label selectors also allow
 * existence terms (`k`, `!k`). Set-based syntax is rejected rather than
 * silently mis-matched.
 */
function parseSelector(selector: string | null, kind: 'field' | 'label'): SelectorTerm[] {
  if (!selector) return [];
  return selector.split(',').map((raw) => {
    const text = raw.trim();
    const equality = /^([\w./-]+)\s*(==|=|!=)\s*([\w./:-]*)$/.exec(text);
    if (equality) {
      const [, key, op, expected] = equality as unknown as [string, string, string, string];
      return term(key, (value) => (op === '!=') !== ((value ?? '') === expected));
    }
    const existence = kind === 'label' ? /^(!?)([\w./-]+)$/.exec(text) : null;
    if (existence) {
      const [, negated, key] = existence as unknown as [string, string, string];
      return term(key, (value) => (value !== undefined) !== (negated === '!'));
    }
    throw new ApiError(400, `unable to parse ${kind} selector requirement: "${text}"`);
  });
}

function term(key: string, test: (value: string | undefined) => boolean): SelectorTerm {
  return Object.assign(test, { key });
}

/** Field selectors compare the string form of a dotted path; a missing field reads as "". */
function fieldValue(object: StoredObject, path: string): string {
  let value: unknown = object;
  for (const segment of path.split('.')) value = isPlainObject(value) ? value[segment] : undefined;
  return value === undefined || value === null ? '' : String(value);
}

// ---- patches --------------------------------------------------------------------

function applyPatch(target: StoredObject, contentType: string, patch: unknown): StoredObject {
  switch (contentType) {
    case 'application/merge-patch+json':
    // Node taints carry no patch strategy, so a strategic merge patch replaces the list whole,
    // which makes it identical to a JSON merge patch for every field this fake stores.
    case 'application/strategic-merge-patch+json':
      return mergePatch(target, patch) as StoredObject;
    case 'application/json-patch+json':
      return applyJsonPatch(target, patch) as StoredObject;
    default:
      throw new ApiError(415, `the body of the request was in an unknown format: ${contentType || '(none)'}`);
  }
}

/** RFC 7386: objects merge recursively, null deletes, anything else replaces. */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isPlainObject(patch)) return structuredClone(patch);
  const result: Record<string, unknown> = isPlainObject(target) ? { ...target } : {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete result[key];
    else result[key] = mergePatch(result[key], value);
  }
  return result;
}

interface JsonPatchOp {
  op: string;
  path: string;
  value?: unknown;
  from?: string;
}

/** RFC 6902 on a deep copy, so a failing operation leaves the stored object untouched. */
function applyJsonPatch(target: unknown, patch: unknown): unknown {
  if (!Array.isArray(patch)) throw new ApiError(400, 'a JSON patch must be an array of operations');
  let doc = structuredClone(target);
  for (const op of patch as JsonPatchOp[]) doc = applyJsonPatchOp(doc, op);
  return doc;
}

function applyJsonPatchOp(doc: unknown, op: JsonPatchOp): unknown {
  switch (op.op) {
    case 'add':
      return pointerAdd(doc, op.path, structuredClone(op.value));
    case 'remove':
      return pointerRemove(doc, op.path);
    case 'replace':
      return pointerAdd(pointerRemove(doc, op.path), op.path, structuredClone(op.value));
    case 'test':
      if (!isDeepStrictEqual(pointerGet(doc, op.path), op.value)) throw new ApiError(422, `test failed at ${op.path}`);
      return doc;
    case 'copy':
      return pointerAdd(doc, op.path, structuredClone(pointerGet(doc, requiredFrom(op))));
    case 'move': {
      const value = pointerGet(doc, requiredFrom(op));
      return pointerAdd(pointerRemove(doc, requiredFrom(op)), op.path, value);
    }
    default:
      throw new ApiError(422, `unsupported JSON patch operation: ${String(op.op)}`);
  }
}

function requiredFrom(op: JsonPatchOp): string {
  if (typeof op.from !== 'string') throw new ApiError(422, `"${op.op}" needs a "from" pointer`);
  return op.from;
}

function parsePointer(pointer: unknown): string[] {
  if (typeof pointer !== 'string' || (pointer !== '' && !pointer.startsWith('/'))) {
    throw new ApiError(422, `invalid JSON pointer: ${String(pointer)}`);
  }
  return pointer === '' ? [] : pointer.slice(1).split('/').map((t) => t.replace(/~1/g, '/').replace(/~0/g, '~'));
}

/** Resolves all but the last token; returns the container and the last token. */
function pointerParent(doc: unknown, pointer: string): { parent: unknown; token: string } {
  const tokens = parsePointer(pointer);
  const token = tokens.pop();
  if (token === undefined) throw new ApiError(422, 'operations on the document root are not supported');
  let parent = doc;
  for (const t of tokens) parent = childOf(parent, t, pointer);
  return { parent, token };
}

function childOf(container: unknown, token: string, pointer: string): unknown {
  const child = Array.isArray(container)
    ? container[arrayIndex(container, token, pointer, false)]
    : isPlainObject(container)
      ? container[token]
      : undefined;
  if (child === undefined) throw new ApiError(422, `path not found: ${pointer}`);
  return child;
}

function arrayIndex(array: unknown[], token: string, pointer: string, insert: boolean): number {
  if (insert && token === '-') return array.length;
  const limit = insert ? array.length : array.length - 1;
  if (!/^(0|[1-9]\d*)$/.test(token) || Number(token) > limit) {
    throw new ApiError(422, `invalid array index in ${pointer}`);
  }
  return Number(token);
}

function pointerGet(doc: unknown, pointer: string): unknown {
  const { parent, token } = pointerParent(doc, pointer);
  return childOf(parent, token, pointer);
}

function pointerAdd(doc: unknown, pointer: string, value: unknown): unknown {
  const { parent, token } = pointerParent(doc, pointer);
  if (Array.isArray(parent)) parent.splice(arrayIndex(parent, token, pointer, true), 0, value);
  else if (isPlainObject(parent)) parent[token] = value;
  else throw new ApiError(422, `path not found: ${pointer}`);
  return doc;
}

function pointerRemove(doc: unknown, pointer: string): unknown {
  const { parent, token } = pointerParent(doc, pointer);
  childOf(parent, token, pointer); // must exist
  if (Array.isArray(parent)) parent.splice(arrayIndex(parent, token, pointer, false), 1);
  else delete (parent as Record<string, unknown>)[token];
  return doc;
}

function validateNode(node: StoredObject): void {
  if (!isPlainObject(node.metadata)) throw new ApiError(422, 'metadata must be an object');
  const taints = isPlainObject(node.spec) ? node.spec.taints : undefined;
  if (taints === undefined) return;
  const valid =
    Array.isArray(taints) &&
    taints.every((t) => isPlainObject(t) && typeof t.key === 'string' && typeof t.effect === 'string');
  if (!valid) throw new ApiError(422, 'spec.taints must be a list of {key, effect} objects');
}

// ---- small utilities --------------------------------------------------------------

function objectKey(resource: ResourceName, metadata: ObjectMeta): string {
  return RESOURCES[resource].namespaced ? `${metadata.namespace}/${metadata.name}` : metadata.name;
}

function withResourceVersion(object: StoredObject, rv: number): StoredObject {
  return { ...object, metadata: { ...object.metadata, resourceVersion: String(rv) } };
}

function nowIso(): string {
  // Kubernetes timestamps have second precision.
  return new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function pushBounded<T>(list: T[], entry: T): void {
  list.push(entry);
  if (list.length > MAX_LOGGED) list.shift();
}

function parseJsonBody(raw: string): unknown {
  try {
    return JSON.parse(raw);
  } catch {
    throw new ApiError(400, 'request body is not valid JSON');
  }
}

/** The request log keeps whatever arrived: parsed JSON when possible, the raw text otherwise. */
function loggedBody(raw: string): { body?: unknown } {
  if (raw === '') return {};
  try {
    return { body: JSON.parse(raw) };
  } catch {
    return { body: raw };
  }
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const payload = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(payload) });
  res.end(payload);
}

// ---- discovery documents ----------------------------------------------------------

const VERSION = {
  major: '1',
  minor: '31',
  gitVersion: 'v1.31.0',
  gitCommit: '0000000000000000000000000000000000000000',
  gitTreeState: 'clean',
  buildDate: '2024-08-13T00:00:00Z',
  goVersion: 'go1.22.5',
  compiler: 'gc',
  platform: 'linux/amd64',
};

const API_GROUP_LIST = {
  kind: 'APIGroupList',
  apiVersion: 'v1',
  groups: [
    {
      name: 'events.k8s.io',
      versions: [{ groupVersion: EVENTS_GROUP_VERSION, version: 'v1' }],
      preferredVersion: { groupVersion: EVENTS_GROUP_VERSION, version: 'v1' },
    },
  ],
};

const EVENT_RESOURCE = {
  name: 'events',
  singularName: 'event',
  namespaced: true,
  kind: 'Event',
  verbs: ['create'],
  shortNames: ['ev'],
};

const CORE_RESOURCES = {
  kind: 'APIResourceList',
  groupVersion: 'v1',
  resources: [
    ...Object.entries(RESOURCES).map(([name, r]) => ({
      name,
      singularName: r.kind.toLowerCase(),
      namespaced: r.namespaced,
      kind: r.kind,
      verbs: r.verbs,
      shortNames: [r.shortName],
    })),
    EVENT_RESOURCE,
  ],
};

const EVENTS_RESOURCES = {
  kind: 'APIResourceList',
  apiVersion: 'v1',
  groupVersion: EVENTS_GROUP_VERSION,
  resources: [EVENT_RESOURCE],
};
