/**
 * `npm run demo` / `kube-iam-broker demo`: the real agent (startAgent) against the embedded
 * Kubernetes API server and the STS stand-in, all on loopback, with no cluster, AWS account or root.
 *
 * It replays the startup race the agent exists for: a pod asks for credentials before the agent
 * has seen it; the pod object is created ~100 ms later; the informer event resolves the waiting
 * request by push. Every audit event is printed as it happens, then a summary.
 */
import { fork } from 'node:child_process';
import type { IncomingMessage } from 'node:http';
import { fileURLToPath } from 'node:url';
import {
  Subscription,
  filter,
  firstValueFrom,
  from,
  fromEvent,
  map,
  merge,
  race,
  startWith,
  take,
  timeout,
} from 'rxjs';
import { z } from 'zod';
import { readiness } from '../admin/server.js';
import { describeEvent } from '../audit/describe.js';
import type { AuditEvent } from '../audit/events.js';
import { loadConfig } from '../config/load.js';
import { clientHold } from '../imds/client-holds.js';
import { callerIp, credentialRoute } from '../imds/server.js';
import { createLogger } from '../log.js';
import { startAgent } from '../main.js';
import { kubeconfigConnection } from '../cluster/kube-connection.js';
import { VERSION } from '../version.js';
import { FakeKubeApi } from './kube-api/server.js';
import { StsStandIn } from './sts.js';

const NODE_NAME = 'demo-node';
/** Any 127.0.0.0/8 address is the machine's own loopback on Linux: a pod IP that needs no setup. */
const POD_IP = '127.0.0.2';
const POD = { namespace: 'shop', name: 'checkout', role: 'checkout-reader' } as const;
const ACCOUNT = '123456789012';
/** How long after the pod's first credential request the pod object appears, as on a busy node. */
const POD_CREATION_DELAY_MS = 100;
/** Bounds every wait of the demo; a healthy run takes a few seconds. */
const STEP_TIMEOUT_MS = 20_000;

export const PodReport = z.discriminatedUnion('kind', [
  z.object({ kind: z.literal('credentials'), accessKeyId: z.string(), expiration: z.string(), elapsedMs: z.number() }),
  z.object({ kind: z.literal('failed'), error: z.string(), elapsedMs: z.number() }),
]);
export type PodReport = z.infer<typeof PodReport>;

/** Runs the demo, printing as it goes; resolves to the process exit code. */
export async function runDemo(
  argv: readonly string[],
  print: (line: string) => void = (line) => console.log(line),
): Promise<number> {
  const startedAt = performance.now();
  const stamp = (text: string) =>
    print(`[${String(Math.round(performance.now() - startedAt)).padStart(5)} ms] ${text}`);
  const podFailed = (failure: PodReport): number => {
    stamp(
      `pod: no credentials after ${Math.round(failure.elapsedMs)} ms: ${failure.kind === 'failed' ? failure.error : 'unexpected report'}`,
    );
    return 1;
  };
  print(
    `kube-iam-broker ${VERSION} demo: the real agent against an embedded cluster and an STS stand-in, all on loopback`,
  );

  const [api, sts] = await Promise.all([FakeKubeApi.start(), StsStandIn.start()]);
  isolateAwsSdk(sts.endpoint);
  const owned = new Subscription();
  let stopAgent: () => Promise<void> = async () => {};
  try {
    api.upsertNamespace({ metadata: { name: POD.namespace } });
    const config = loadConfig(argv, {
      BROKER_LOG_LEVEL: 'warn',
      ...process.env,
      BROKER_NODE_NAME: NODE_NAME,
      BROKER_LISTEN: '127.0.0.1:0',
      BROKER_ADMIN_LISTEN: '127.0.0.1:0',
      BROKER_METRICS_LISTEN: '127.0.0.1:0',
      // The container door needs a link-local address on the node; the demo shows the metadata door.
      BROKER_CONTAINER_LISTEN: 'off',
      BROKER_BASE_ROLE_ARN: `arn:aws:iam::${ACCOUNT}:role/`,
      // Never the real 169.254.169.254: nothing listens on the discard port, and with the base ARN
      // and region given, the agent has no reason to ask.
      BROKER_METADATA_UPSTREAM: 'http://127.0.0.1:9',
    });
    const kube = kubeconfigConnection(api.kubeconfigText(), process.cwd(), "the embedded cluster's kubeconfig");
    const logger = createLogger(config.logLevel, { write: (line: string) => void process.stderr.write(line) });
    const agent = await startAgent(config, { logger, kube });
    stopAgent = () => agent.stop();
    print(`  cluster API    ${api.url} (embedded, wire-level)`);
    print(`  STS            ${sts.endpoint} (stand-in, AWS_ENDPOINT_URL_STS)`);
    print(
      `  agent          metadata http://127.0.0.1:${agent.imds.address.port}, admin http://127.0.0.1:${agent.admin.address.port}, the JS SDK's request waits up to ${clientHold(undefined, config).holdMs} ms for its pod`,
    );

    const events: Array<{ event: AuditEvent; atMs: number }> = [];
    owned.add(
      agent.audit.events$.subscribe((event) => {
        events.push({ event, atMs: performance.now() });
        stamp(`event  ${describeEvent(event)}`);
      }),
    );

    await firstValueFrom(
      agent.index.applied$.pipe(
        startWith(undefined),
        filter(() => readiness(agent.index.view).ready),
        take(1),
        timeout(STEP_TIMEOUT_MS),
      ),
    );
    stamp('agent ready: the pod and namespace informers have synced');

    stamp(
      `pod ${POD.namespace}/${POD.name} (${POD_IP}) starts and asks for credentials with the AWS JS SDK; the cluster has no such pod yet`,
    );
    // The SDK's own default timeout: the agent holds a request from the JS SDK inside it.
    const podReport = runPod(`http://127.0.0.1:${agent.imds.address.port}`, 1_000);
    // The pod's first credential request as the server receives it, unless the pod fails first
    // (say, 127.0.0.2 cannot be bound): race drops whichever loses. The fork takes far longer than
    // this synchronous subscription, so no request can arrive before it.
    const first = await firstValueFrom(
      race(
        fromEvent(agent.imds.server, 'request', (req: IncomingMessage) => req).pipe(
          filter(
            (req) =>
              callerIp(req) === POD_IP &&
              req.method === 'GET' &&
              credentialRoute((req.url ?? '').split('?')[0] ?? '') !== undefined,
          ),
          map((request) => ({ request })),
        ),
        from(podReport).pipe(map((report) => ({ report }))),
      ).pipe(take(1), timeout(STEP_TIMEOUT_MS)),
    );
    if ('report' in first) return podFailed(first.report);
    const { request } = first;
    stamp(
      `pod's request arrived: ${request.method} ${request.url}; pod known for ${POD_IP}: ${agent.index.view.ownerOf(POD_IP) ? 'yes' : 'no'}, so the agent waits`,
    );
    await new Promise((resolve) => setTimeout(resolve, POD_CREATION_DELAY_MS));
    api.upsertPod({
      metadata: { name: POD.name, namespace: POD.namespace, annotations: { [config.roleAnnotation]: POD.role } },
      spec: { nodeName: NODE_NAME, serviceAccountName: POD.name },
      status: { phase: 'Running', podIP: POD_IP, podIPs: [{ ip: POD_IP }] },
    });
    const podCreatedAtMs = performance.now();
    stamp(
      `cluster: pod ${POD.namespace}/${POD.name} created with IP ${POD_IP}, ${POD_CREATION_DELAY_MS} ms after its request arrived`,
    );

    const report = await podReport;
    if (report.kind === 'failed') return podFailed(report);
    stamp(
      `pod: the SDK has credentials ${report.accessKeyId.slice(0, 8)}… (expire ${report.expiration}), ${Math.round(report.elapsedMs)} ms after it started`,
    );

    const waited = events.find(({ event }) => event.type === 'lookup.waited' && event.podIp === POD_IP);
    const issued = events.find(({ event }) => event.type === 'credential.issued' && event.podIp === POD_IP)?.event;
    const roleArn = issued?.roleArn;
    const session = sts.calls.find((call) => call.roleArn === roleArn);
    print('');
    print('Summary');
    print(`  role           ${roleArn ?? '(none)'}`);
    print(`  session name   ${session?.sessionName ?? '(none)'}   (what CloudTrail shows for this pod's calls)`);
    if (waited?.event.type === 'lookup.waited') {
      print(
        `  waited ms      ${Math.round(waited.event.waitedMs)}   (the pod's first request, held until its pod was known)`,
      );
      print(
        `  resolved by    ${waited.event.outcome}, ${(waited.atMs - podCreatedAtMs).toFixed(1)} ms after the pod event (no polling)`,
      );
    }
    return waited?.event.type === 'lookup.waited' && waited.event.outcome === 'push' && session !== undefined ? 0 : 1;
  } finally {
    await stopAgent();
    owned.unsubscribe();
    await Promise.all([api.stop(), sts.stop()]);
  }
}

/** The agent's own SDK must reach the stand-in and nothing else, whatever the caller's environment holds. */
function isolateAwsSdk(stsEndpoint: string): void {
  for (const name of [
    'AWS_PROFILE',
    'AWS_SESSION_TOKEN',
    'AWS_ROLE_ARN',
    'AWS_WEB_IDENTITY_TOKEN_FILE',
    'AWS_CONTAINER_CREDENTIALS_FULL_URI',
    'AWS_CONTAINER_CREDENTIALS_RELATIVE_URI',
  ])
    delete process.env[name];
  Object.assign(process.env, {
    AWS_ENDPOINT_URL_STS: stsEndpoint,
    AWS_IGNORE_CONFIGURED_ENDPOINT_URLS: 'false',
    AWS_REGION: 'us-east-1',
    AWS_ACCESS_KEY_ID: 'demo',
    AWS_SECRET_ACCESS_KEY: 'demo',
    AWS_CONFIG_FILE: '/dev/null',
    AWS_SHARED_CREDENTIALS_FILE: '/dev/null',
    AWS_EC2_METADATA_DISABLED: 'true',
  });
}

/** Forks the pod process (the module beside this one, .ts under tsx, .js when built) and resolves with its one report. */
function runPod(imdsEndpoint: string, sdkTimeoutMs: number): Promise<PodReport> {
  const ownPath = fileURLToPath(import.meta.url);
  const podScript = ownPath.replace(/demo\.([jt]s)$/, 'demo-pod.$1');
  const child = fork(podScript, [POD_IP, String(sdkTimeoutMs)], {
    // The pod's SDK reads its endpoint like any EC2 application; AWS_EC2_METADATA_DISABLED is for the agent only.
    env: { ...process.env, AWS_EC2_METADATA_SERVICE_ENDPOINT: imdsEndpoint, AWS_EC2_METADATA_DISABLED: 'false' },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const message = fromEvent(child, 'message', (raw: unknown) => PodReport.parse(raw));
  const exitedSilently = fromEvent(child, 'exit', (code: number | null) => code).pipe(
    map((code): PodReport => ({
      kind: 'failed',
      error: `the pod process exited (${code}) without a report`,
      elapsedMs: 0,
    })),
  );
  return firstValueFrom(merge(message, exitedSilently).pipe(take(1), timeout(STEP_TIMEOUT_MS))).finally(() =>
    child.kill(),
  );
}
