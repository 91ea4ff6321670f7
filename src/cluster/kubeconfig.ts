/**
 * Where the API server is: the kubeconfig file(s) configured (BROKER_KUBECONFIG or KUBECONFIG, a
 * `:`-separated list as kubectl reads it), else the in-cluster service account. Anything that would
 * otherwise surface later as a retried `Invalid URL` is a ConfigError here, naming what to fix.
 */
import { accessSync, constants, readFileSync } from 'node:fs';
import { delimiter } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { ConfigError } from '../config/load.js';

export const SERVICE_ACCOUNT_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

/** `paths` as configured; `env` for the in-cluster variables; `tokenPath` lets tests point elsewhere. */
export function loadKubeConfig(paths: string | undefined, env: NodeJS.ProcessEnv = process.env, tokenPath = SERVICE_ACCOUNT_TOKEN): KubeConfig {
  if (paths !== undefined) return fromFiles(paths.split(delimiter).filter((path) => path !== ''));
  if (!env.KUBERNETES_SERVICE_HOST || !env.KUBERNETES_SERVICE_PORT || !readable(tokenPath)) {
    throw new ConfigError([
      `no in-cluster service account (KUBERNETES_SERVICE_HOST/PORT unset or ${tokenPath} unreadable) and no KUBECONFIG: run the agent in a pod, or set KUBECONFIG (BROKER_KUBECONFIG, --kubeconfig) to a kubeconfig file`,
    ]);
  }
  const kubeConfig = new KubeConfig();
  kubeConfig.loadFromCluster();
  return kubeConfig;
}

/** kubectl's merge: the first file that sets a value wins, including the current context. */
function fromFiles(paths: readonly string[]): KubeConfig {
  if (paths.length === 0) throw new ConfigError(['KUBECONFIG names no file: set it to a kubeconfig path (a:b for several) or unset it inside a cluster']);
  const [first, ...rest] = paths.map(fromFile) as [KubeConfig, ...KubeConfig[]];
  const merged = first;
  for (const next of rest) {
    const absent = <T extends { name: string }>(mine: readonly T[]) => (theirs: T) => !mine.some((entry) => entry.name === theirs.name);
    next.clusters.filter(absent(merged.clusters)).forEach((cluster) => merged.addCluster(cluster));
    next.users.filter(absent(merged.users)).forEach((user) => merged.addUser(user));
    next.contexts.filter(absent(merged.contexts)).forEach((context) => merged.addContext(context));
    if (!merged.getCurrentContext()) merged.setCurrentContext(next.getCurrentContext());
  }
  const cluster = merged.getCurrentCluster();
  if (!cluster) {
    throw new ConfigError([
      `kubeconfig ${paths.join(delimiter)}: ${merged.getCurrentContext() ? `current context "${merged.getCurrentContext()}" names no cluster defined there` : 'no current-context'}; set current-context to a context whose cluster has a server`,
    ]);
  }
  try {
    new URL(cluster.server);
  } catch {
    throw new ConfigError([`kubeconfig ${paths.join(delimiter)}: cluster "${cluster.name}" has server "${cluster.server}", not a URL such as https://10.0.0.1:6443`]);
  }
  return merged;
}

function fromFile(path: string): KubeConfig {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'does not exist' : code === 'EACCES' ? 'is not readable by the agent' : code === 'EISDIR' ? 'is a directory' : String(error);
    throw new ConfigError([`kubeconfig ${path} ${why}: set KUBECONFIG (BROKER_KUBECONFIG, --kubeconfig) to a readable kubeconfig file, or unset it inside a cluster`]);
  }
  if (text.trim() === '') throw new ConfigError([`kubeconfig ${path} is empty: it needs clusters, users, contexts and a current-context`]);
  const kubeConfig = new KubeConfig();
  try {
    kubeConfig.loadFromString(text);
  } catch (error) {
    throw new ConfigError([`kubeconfig ${path} is not a valid kubeconfig: ${String((error as Error).message ?? error).split('\n')[0]}`]);
  }
  return kubeConfig;
}

function readable(path: string): boolean {
  try {
    accessSync(path, constants.R_OK);
    return true;
  } catch {
    return false;
  }
}
