/**
 * How the agent reaches the Kubernetes API server: a kubeconfig (BROKER_KUBECONFIG or KUBECONFIG) or the in-cluster
 * service account, validated with zod, and the few REST calls the agent makes.
 *
 * Why not @kubernetes/client-node's KubeConfig and CoreV1Api: importing them loads the whole
 * generated API client (every model of every API group), about 80 MB of RSS on a node agent
 * whose budget is 64 MB. The agent needs a server URL, TLS settings, a bearer token or a client
 * certificate, and five requests. The informer still is client-node's ListWatch and Watch,
 * imported from their own modules; watchConfig() gives Watch what it reads of a KubeConfig.
 */
import { accessSync, constants, readFileSync } from 'node:fs';
import { Agent as HttpAgent, type IncomingMessage, request as httpRequest } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { delimiter, dirname, isAbsolute, join } from 'node:path';
import { load as parseYaml } from 'js-yaml';
import type { KubernetesListObject, KubernetesObject } from '@kubernetes/client-node/dist/types.js';
import { z } from 'zod';
import { ConfigError } from '../config/load.js';

export interface KubeConnection {
  /** The API server's base URL, without a trailing slash. */
  readonly server: string;
  /** Authorization header for the next request: a token file is re-read, as projected tokens rotate. */
  authorization(): string | undefined;
  readonly agent: HttpAgent;
}

/** An API server's answer other than 2xx: statusCode as the server sent it, message from its Status. */
export class KubeApiError extends Error {
  constructor(
    readonly statusCode: number,
    message: string,
  ) {
    super(message);
    this.name = 'KubeApiError';
  }
}

const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';
const REQUEST_TIMEOUT_MS = 30_000;

const Kubeconfig = z.object({
  'current-context': z.string().min(1, 'current-context is empty'),
  contexts: z.array(
    z.object({ name: z.string(), context: z.object({ cluster: z.string(), user: z.string().optional() }) }),
  ),
  clusters: z.array(
    z.object({
      name: z.string(),
      cluster: z.object({
        server: z.string(),
        'certificate-authority': z.string().optional(),
        'certificate-authority-data': z.string().optional(),
        'insecure-skip-tls-verify': z.boolean().optional(),
        'tls-server-name': z.string().optional(),
      }),
    }),
  ),
  users: z
    .array(
      z.object({
        name: z.string(),
        user: z
          .object({
            token: z.string().optional(),
            tokenFile: z.string().optional(),
            'client-certificate': z.string().optional(),
            'client-certificate-data': z.string().optional(),
            'client-key': z.string().optional(),
            'client-key-data': z.string().optional(),
            exec: z.unknown().optional(),
            'auth-provider': z.unknown().optional(),
          })
          .nullish(),
      }),
    )
    .default([]),
});

/**
 * The kubeconfig file(s) configured (BROKER_KUBECONFIG, else KUBECONFIG: a `:`-separated list,
 * merged as kubectl merges it), else the pod's service account. Anything that would otherwise
 * surface later as a retried request error is a ConfigError here, naming what to fix.
 */
export function loadKubeConnection(
  kubeconfig: string | undefined,
  env: NodeJS.ProcessEnv = process.env,
): KubeConnection {
  if (kubeconfig === undefined) return inClusterConnection(env);
  const paths = kubeconfig.split(delimiter).filter((entry) => entry.length > 0);
  if (paths.length === 0)
    throw new ConfigError([
      'KUBECONFIG names no file: set it to a kubeconfig path (a:b for several) or unset it inside a cluster',
    ]);
  // kubectl's merge: the first file that sets a value wins; relative paths stay relative to the first file.
  const merged: Record<string, unknown> = {};
  for (const path of paths) {
    for (const [key, value] of Object.entries(readKubeconfigFile(path))) {
      if (Array.isArray(value) && Array.isArray(merged[key])) {
        const mine = merged[key] as Array<{ name?: unknown }>;
        mine.push(
          ...(value as Array<{ name?: unknown }>).filter(
            (entry) => !mine.some((existing) => existing.name === entry.name),
          ),
        );
      } else if (merged[key] === undefined) {
        merged[key] = Array.isArray(value) ? [...(value as unknown[])] : value;
      }
    }
  }
  return kubeconfigConnection(merged, dirname(paths[0] as string), `kubeconfig ${paths.join(delimiter)}`);
}

function readKubeconfigFile(path: string): Record<string, unknown> {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    const why =
      code === 'ENOENT'
        ? 'does not exist'
        : code === 'EACCES'
          ? 'is not readable by the agent'
          : code === 'EISDIR'
            ? 'is a directory'
            : String(error);
    throw new ConfigError([
      `kubeconfig ${path} ${why}: set KUBECONFIG (BROKER_KUBECONFIG, --kubeconfig) to a readable kubeconfig file, or unset it inside a cluster`,
    ]);
  }
  if (text.trim() === '')
    throw new ConfigError([`kubeconfig ${path} is empty: it needs clusters, users, contexts and a current-context`]);
  let document: unknown;
  try {
    document = parseYaml(text);
  } catch (error) {
    throw new ConfigError([
      `kubeconfig ${path} is not a valid kubeconfig: ${String((error as Error).message ?? error).split('\n')[0]}`,
    ]);
  }
  if (typeof document !== 'object' || document === null || Array.isArray(document))
    throw new ConfigError([`kubeconfig ${path} is not a valid kubeconfig: expected a YAML mapping`]);
  return document as Record<string, unknown>;
}

/** A kubeconfig's current context (its text, or the document parsed). Relative file paths in it are read from baseDir. */
export function kubeconfigConnection(
  kubeconfig: string | Record<string, unknown>,
  baseDir: string,
  source = 'kubeconfig',
): KubeConnection {
  const document = typeof kubeconfig === 'string' ? parseYaml(kubeconfig) : kubeconfig;
  if (!(document as { 'current-context'?: unknown } | null)?.['current-context']) {
    throw new ConfigError([
      `${source}: no current-context; set current-context to a context whose cluster has a server`,
    ]);
  }
  const parsed = Kubeconfig.safeParse(document);
  if (!parsed.success)
    throw new ConfigError([
      `${source}: ${parsed.error.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`).join('; ')}`,
    ]);
  const config = parsed.data;
  const contextName = config['current-context'];
  const context = config.contexts.find((entry) => entry.name === contextName)?.context;
  if (!context) throw new ConfigError([`${source}: current-context ${contextName} is not among its contexts`]);
  const named = config.clusters.find((entry) => entry.name === context.cluster);
  if (!named)
    throw new ConfigError([
      `${source}: current context "${contextName}" names cluster ${context.cluster}, which it does not define; set current-context to a context whose cluster has a server`,
    ]);
  const cluster = named.cluster;
  if (!URL.canParse(cluster.server))
    throw new ConfigError([
      `${source}: cluster "${named.name}" has server "${cluster.server}", not a URL such as https://10.0.0.1:6443`,
    ]);
  const user =
    (context.user === undefined ? undefined : config.users.find((entry) => entry.name === context.user)?.user) ?? {};
  if (user.exec !== undefined || user['auth-provider'] !== undefined) {
    throw new ConfigError([
      `${source}: user ${context.user} authenticates with an exec plugin or auth provider, which the agent does not run; give it a token, tokenFile or client certificate (in a cluster, the service account is used)`,
    ]);
  }
  const file = (name: string) => readFileSync(isAbsolute(name) ? name : join(baseDir, name));
  const pem = (data: string | undefined, path: string | undefined) =>
    data !== undefined ? Buffer.from(data, 'base64') : path !== undefined ? file(path) : undefined;
  const tokenFile =
    user.tokenFile === undefined
      ? undefined
      : isAbsolute(user.tokenFile)
        ? user.tokenFile
        : join(baseDir, user.tokenFile);
  return connection(cluster.server, {
    ca: pem(cluster['certificate-authority-data'], cluster['certificate-authority']),
    cert: pem(user['client-certificate-data'], user['client-certificate']),
    key: pem(user['client-key-data'], user['client-key']),
    rejectUnauthorized: !cluster['insecure-skip-tls-verify'],
    servername: cluster['tls-server-name'],
    token: user.token,
    tokenFile,
  });
}

function inClusterConnection(env: NodeJS.ProcessEnv): KubeConnection {
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT;
  const token = join(SERVICE_ACCOUNT_DIR, 'token');
  if (!host || !port || !readable(token)) {
    throw new ConfigError([
      `no in-cluster service account (KUBERNETES_SERVICE_HOST/PORT unset or ${token} unreadable) and no KUBECONFIG: run the agent in a pod, or set KUBECONFIG (BROKER_KUBECONFIG, --kubeconfig) to a kubeconfig file`,
    ]);
  }
  const server = `https://${host.includes(':') ? `[${host}]` : host}:${port}`;
  return connection(server, {
    ca: readFileSync(join(SERVICE_ACCOUNT_DIR, 'ca.crt')),
    rejectUnauthorized: true,
    tokenFile: token,
  });
}

function readable(path: string): boolean {
  try {
    accessSync(path, constants.R_OK);
    return true;
  } catch {
    return false;
  }
}

interface Credentials {
  readonly ca?: Buffer | undefined;
  readonly cert?: Buffer | undefined;
  readonly key?: Buffer | undefined;
  readonly rejectUnauthorized: boolean;
  readonly servername?: string | undefined;
  readonly token?: string | undefined;
  readonly tokenFile?: string | undefined;
}

function connection(server: string, credentials: Credentials): KubeConnection {
  const { token, tokenFile } = credentials;
  if (tokenFile !== undefined) readFileSync(tokenFile); // a missing token file is an error at start, not at the first request
  const agent = server.startsWith('https:')
    ? new HttpsAgent({
        keepAlive: true,
        ca: credentials.ca,
        cert: credentials.cert,
        key: credentials.key,
        rejectUnauthorized: credentials.rejectUnauthorized,
        ...(credentials.servername ? { servername: credentials.servername } : {}),
      })
    : new HttpAgent({ keepAlive: true });
  const bearer = () => (tokenFile !== undefined ? readFileSync(tokenFile, 'utf8').trim() : token);
  return {
    server: server.replace(/\/+$/, ''),
    agent,
    authorization() {
      const value = bearer();
      return value ? `Bearer ${value}` : undefined;
    },
  };
}

export interface KubeRequest {
  readonly method?: 'GET' | 'POST' | 'PATCH';
  readonly query?: Readonly<Record<string, string | undefined>>;
  readonly body?: unknown;
  readonly contentType?: string;
}

/** One JSON request to the API server; a non-2xx answer rejects with KubeApiError. */
export function kubeRequest(kube: KubeConnection, path: string, options: KubeRequest = {}): Promise<unknown> {
  const url = new URL(kube.server + path);
  for (const [key, value] of Object.entries(options.query ?? {}))
    if (value !== undefined) url.searchParams.set(key, value);
  const body = options.body === undefined ? undefined : JSON.stringify(options.body);
  const authorization = kube.authorization();
  const headers: Record<string, string> = {
    Accept: 'application/json',
    ...(authorization ? { Authorization: authorization } : {}),
    ...(body !== undefined
      ? { 'Content-Type': options.contentType ?? 'application/json', 'Content-Length': String(Buffer.byteLength(body)) }
      : {}),
  };
  const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
  return new Promise((resolve, reject) => {
    const req = send(
      url,
      { method: options.method ?? 'GET', headers, agent: kube.agent, timeout: REQUEST_TIMEOUT_MS },
      (res) => {
        readJson(res).then((answer) => {
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) resolve(answer);
          else reject(new KubeApiError(status, statusMessage(answer) ?? `HTTP ${status} from ${url.pathname}`));
        }, reject);
      },
    );
    req.on('timeout', () =>
      req.destroy(new Error(`no answer from the API server within ${REQUEST_TIMEOUT_MS} ms (${url.pathname})`)),
    );
    req.on('error', reject);
    req.end(body);
  });
}

async function readJson(res: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of res) chunks.push(chunk as Buffer);
  const text = Buffer.concat(chunks).toString('utf8');
  try {
    return text.length > 0 ? JSON.parse(text) : undefined;
  } catch {
    return text;
  }
}

function statusMessage(answer: unknown): string | undefined {
  const message = (answer as { message?: unknown } | undefined)?.message;
  return typeof message === 'string' ? message : undefined;
}

/**
 * What client-node's Watch reads of a KubeConfig (1.x): the current cluster's server, and the
 * fetch options (node-fetch) carrying the agent and the Authorization header.
 */
export interface WatchConfig {
  getCurrentCluster(): { readonly server: string };
  applyToFetchOptions(options: object): Promise<{ agent: HttpAgent; headers: Record<string, string> }>;
}

export function watchConfig(kube: KubeConnection): WatchConfig {
  return {
    getCurrentCluster: () => ({ server: kube.server }),
    applyToFetchOptions: (options) => {
      const authorization = kube.authorization();
      const headers: Record<string, string> = authorization ? { Authorization: authorization } : {};
      return Promise.resolve({ ...options, agent: kube.agent, headers });
    },
  };
}

const ListAnswer = z.object({
  metadata: z.object({ resourceVersion: z.string().optional() }).optional(),
  items: z.array(z.record(z.string(), z.unknown())).nullish(),
});

/** A list request (GET on a collection), validated as far as ListWatch relies on it. */
export async function kubeList(
  kube: KubeConnection,
  path: string,
  query: Readonly<Record<string, string | undefined>> = {},
): Promise<KubernetesListObject<KubernetesObject>> {
  const parsed = ListAnswer.safeParse(await kubeRequest(kube, path, { query }));
  if (!parsed.success)
    throw new Error(
      `the API server's list of ${path} is not a list: ${parsed.error.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`).join('; ')}`,
    );
  return { metadata: parsed.data.metadata ?? {}, items: parsed.data.items ?? [] };
}
