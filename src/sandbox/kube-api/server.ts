/**
 * A wire-level fake of the Kubernetes API server, small enough to embed.
 *
 * It speaks the subset of the real protocol the broker relies on (discovery,
 * list, chunked JSON watches with resourceVersion replay, node PATCH, event
 * creation) so that the real `kubectl` binary and `@kubernetes/client-node`
 * can talk to it unmodified. State lives in memory and is driven from code
 * (`upsertPod`, `deletePod`, ...); faults such as compaction, dropped
 * watches, failing requests and a down server are injected on demand.
 */
import { writeFileSync } from 'node:fs';
import { createServer, STATUS_CODES } from 'node:http';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { join } from 'node:path';
import { readBody } from '../../http/body.js';
import { discoveryRoutes } from './discovery.js';
import type {
  Namespace,
  NamespaceInput,
  Node,
  NodeInput,
  ObjectInput,
  Pod,
  PodInput,
  StoredObject,
} from './objects.js';
import { DISCOVERED, NAMESPACES, NODES, PODS, SERVICE_ACCOUNTS, resourceRoutes } from './resources.js';
import { ServiceAccountTokens, type TokenRequest } from './service-account-tokens.js';
import { type RequestContext, type Route, dispatch } from './routing.js';
import { ApiError, statusBody } from './status.js';
import { ObjectStore } from './store.js';
import { Watches } from './watch.js';

export interface RecordedRequest {
  method: string;
  path: string;
  query: Record<string, string>;
  body?: unknown;
}

/** Caps on the assertion logs so a long-running embedded demo does not grow without bound. */
const MAX_LOGGED = 10_000;
const MAX_BODY_BYTES = 1024 * 1024;
const HOST = '127.0.0.1';

export class FakeKubeApi {
  readonly requests: RecordedRequest[] = [];
  readonly createdEvents: unknown[] = [];

  private readonly server: Server;
  private port = 0;
  private readonly sockets = new Set<Socket>();
  private readonly store = new ObjectStore();
  private readonly watches = new Watches(this.store);
  private readonly tokens = new ServiceAccountTokens();
  private pendingFailures: { count: number; status: number } = { count: 0, status: 500 };
  private listening = false;
  private readonly routes: Route[];

  private constructor() {
    const cluster = {
      store: this.store,
      watches: this.watches,
      tokens: this.tokens,
      recordEvent: (event: unknown) => pushBounded(this.createdEvents, event),
    };
    this.routes = [...discoveryRoutes(DISCOVERED, () => `${HOST}:${this.port}`), ...resourceRoutes(cluster)];
    this.server = createServer((req, res) => void this.handle(req, res));
    this.server.on('connection', (socket) => this.trackSocket(socket));
  }

  /** Listens on a free port of 127.0.0.1. */
  static async start(): Promise<FakeKubeApi> {
    const api = new FakeKubeApi();
    await api.listen();
    return api;
  }

  get url(): string {
    return `http://${HOST}:${this.port}`;
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

  upsertPod(pod: PodInput): Pod {
    const metadata = { ...pod.metadata, namespace: pod.metadata.namespace ?? 'default' };
    return this.store.put(PODS, { ...pod, metadata }) as Pod;
  }

  deletePod(namespace: string, name: string): Pod | undefined {
    return this.store.remove(PODS, `${namespace}/${name}`) as Pod | undefined;
  }

  upsertServiceAccount(account: ObjectInput): StoredObject {
    return this.store.put(SERVICE_ACCOUNTS, {
      ...account,
      metadata: { ...account.metadata, namespace: account.metadata.namespace ?? 'default' },
    });
  }

  /** A projected service-account token for a stored pod, as the kubelet would write it into the pod's volume. */
  issueToken(namespace: string, podName: string, request: TokenRequest): string {
    const pod = this.store.get(PODS, `${namespace}/${podName}`) as Pod | undefined;
    if (!pod) throw new Error(`no pod ${namespace}/${podName} to bind a token to`);
    const bound = {
      namespace,
      name: podName,
      uid: pod.metadata.uid,
      serviceAccount: pod.spec?.serviceAccountName ?? 'default',
      nodeName: pod.spec?.nodeName,
    };
    return this.tokens.issue(bound, request);
  }

  upsertNamespace(ns: NamespaceInput): Namespace {
    return this.store.put(NAMESPACES, { status: { phase: 'Active' }, ...ns }) as Namespace;
  }

  upsertNode(node: NodeInput): Node {
    return this.store.put(NODES, node) as Node;
  }

  getNode(name: string): Node | undefined {
    const node = this.store.get(NODES, name);
    return node && (structuredClone(node) as Node);
  }

  pods(): Pod[] {
    return this.store.list(PODS).map((pod) => structuredClone(pod) as Pod);
  }

  /** Destroys every watch socket mid-stream, as a network cut would. */
  dropWatches(): void {
    this.watches.dropAll();
  }

  /** Ends every watch with a proper final chunk, as the API server's watch timeout does. */
  endWatches(): void {
    this.watches.endAll();
  }

  compact(): void {
    this.store.compact();
    this.watches.expireAll();
  }

  /** Compacts history through throughRv; see ObjectStore.compactThrough. */
  compactThrough(throughRv: number): void {
    this.store.compactThrough(throughRv);
  }

  /** The resourceVersion of the latest change. */
  get currentResourceVersion(): number {
    return this.store.resourceVersion;
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

  private async listen(): Promise<void> {
    if (this.listening) return;
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.port, HOST, () => {
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

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      const url = new URL(req.url ?? '/', 'http://fake');
      const method = req.method ?? 'GET';
      const raw = await readBody(req, MAX_BODY_BYTES, () => new ApiError(413, 'request body too large'));
      pushBounded(this.requests, {
        method,
        path: url.pathname,
        query: Object.fromEntries(url.searchParams),
        ...loggedBody(raw),
      });
      this.injectFailure();
      const ctx: RequestContext = {
        method,
        query: url.searchParams,
        contentType: (req.headers['content-type'] ?? '').split(';')[0]?.trim() ?? '',
        body: method === 'POST' || method === 'PATCH' ? parseJsonBody(raw) : undefined,
        res,
      };
      const reply = dispatch(this.routes, ctx, url.pathname);
      if (reply) sendJson(res, reply.status, reply.body);
    } catch (error) {
      const code = error instanceof ApiError ? error.code : 500;
      if (!res.headersSent) sendJson(res, code, statusBody(code, (error as Error).message));
      else res.destroy();
    }
  }

  private injectFailure(): void {
    if (this.pendingFailures.count <= 0) return;
    this.pendingFailures.count -= 1;
    const { status } = this.pendingFailures;
    throw new ApiError(status, `injected failure: ${STATUS_CODES[status] ?? status}`);
  }
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
