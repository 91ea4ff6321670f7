/**
 * `npm run demo` / `kube-iam-broker demo`: the real agent (startAgent) against the embedded
 * Kubernetes API server and the STS stand-in, all on loopback, with no cluster, AWS account or root.
 *
 * It replays the startup race the agent exists for: a pod asks for credentials before the agent
 * has seen it; the pod object is created ~100 ms later; the informer event resolves the waiting
 * request by push. Every audit event is printed as it happens, then a summary.
 *
 * Act two: a pod spec goes through the webhook's mutation (src/webhook/mutation.ts), the demo
 * writes the token the cluster signs for it where its projected volume would be, and the same JS
 * SDK, through its default chain, gets the pod's role from the container-credentials door.
 */
import { fork } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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
  toArray,
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
import { Pod as AdmissionPod } from '../webhook/admission.js';
import { wiringSettings } from '../webhook/main.js';
import { INJECT_ANNOTATION, TOKEN_FILE, TOKEN_VOLUME, wirePod } from '../webhook/mutation.js';
import { applyPatch } from './kube-api/json-patch.js';
import type { StoredObject } from './kube-api/objects.js';
import { FakeKubeApi } from './kube-api/server.js';
import { StsStandIn } from './sts.js';

const NODE_NAME = 'demo-node';
/** Any 127.0.0.0/8 address is the machine's own loopback on Linux: a pod IP that needs no setup. */
const POD_IP = '127.0.0.2';
const POD = { namespace: 'shop', name: 'checkout', role: 'checkout-reader' } as const;
/** Act two's pod, wired by the webhook and proven by its service-account token rather than its IP. */
const WIRED_POD = { namespace: 'shop', name: 'reports', role: 'reports-writer', ip: '127.0.0.3' } as const;
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

  const [api, sts, containerPort, tokenDir] = await Promise.all([
    FakeKubeApi.start(),
    StsStandIn.start(),
    freeLoopbackPort(),
    mkdtemp(join(tmpdir(), 'kib-demo-token-')),
  ]);
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
      // Loopback, which the SDKs accept over plain http like 169.254.170.23; no link to bring up.
      BROKER_CONTAINER_LISTEN: `127.0.0.1:${containerPort}`,
      BROKER_CONTAINER_LINK: 'off',
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
      `  agent          metadata http://127.0.0.1:${agent.imds.address.port}, container ${config.containerListen}, admin http://127.0.0.1:${agent.admin.address.port}, the JS SDK's request waits up to ${clientHold(undefined, config).holdMs} ms for its pod`,
    );

    const events: Array<{ event: AuditEvent; atMs: number }> = [];
    owned.add(
      agent.audit.events$.subscribe((event) => {
        events.push({ event, atMs: performance.now() });
        stamp(`event${event.door === 'container' ? ' (container door)' : ''}  ${describeEvent(event)}`);
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
    const podReport = runPod(POD_IP, [String(1_000)], {
      // The pod's SDK reads its endpoint like any EC2 application; AWS_EC2_METADATA_DISABLED is for the agent only.
      AWS_EC2_METADATA_SERVICE_ENDPOINT: `http://127.0.0.1:${agent.imds.address.port}`,
      AWS_EC2_METADATA_DISABLED: 'false',
    });
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
    if (!(waited?.event.type === 'lookup.waited' && waited.event.outcome === 'push' && session !== undefined)) return 1;

    // Act two: the webhook's mutation wires a pod to the container door.
    print('');
    stamp(`act two: pod ${WIRED_POD.namespace}/${WIRED_POD.name} asks to be wired (${INJECT_ANNOTATION}: "true")`);
    const settings = wiringSettings(config);
    const submitted = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: {
        name: WIRED_POD.name,
        namespace: WIRED_POD.namespace,
        annotations: { [INJECT_ANNOTATION]: 'true', [config.roleAnnotation]: WIRED_POD.role },
      },
      spec: { serviceAccountName: WIRED_POD.name, containers: [{ name: 'app', image: 'reports:1.0' }] },
    };
    const wiring = wirePod(AdmissionPod.parse(submitted), settings, 'annotation');
    const wired = AdmissionPod.parse(
      applyPatch(submitted as unknown as StoredObject, 'application/json-patch+json', wiring.patch),
    );
    const app = wired.spec.containers[0];
    const volume = wired.spec.volumes?.find((candidate) => candidate.name === TOKEN_VOLUME);
    stamp(`webhook: ${wiring.outcome}, a JSON patch of ${wiring.patch.length} operations; container "app" now has`);
    for (const variable of app?.env ?? []) print(`    env    ${variable.name}=${variable.value ?? ''}`);
    for (const mount of app?.volumeMounts ?? []) print(`    mount  ${mount.name} at ${mount.mountPath}`);
    print(`    volume ${volume?.name ?? '(none)'}: ${JSON.stringify(volume?.projected)}`);

    // The pod is indexed and, with prefetch on arrival, its role fetched from STS before it starts:
    // waiting for both keeps the story in one order.
    const wiredSession = `${WIRED_POD.namespace}@${WIRED_POD.name}`;
    const indexed = firstValueFrom(
      agent.audit.events$.pipe(
        filter(
          (event) =>
            (event.type === 'pod.indexed' && event.podIp === WIRED_POD.ip) ||
            (event.type === 'sts.call' && event.sessionName === wiredSession),
        ),
        take(config.prefetch === 'arrival' ? 2 : 1),
        toArray(),
        timeout(STEP_TIMEOUT_MS),
      ),
    );
    api.upsertPod({
      ...wired,
      metadata: { ...wired.metadata, name: WIRED_POD.name, namespace: WIRED_POD.namespace },
      spec: { ...wired.spec, nodeName: NODE_NAME },
      status: { phase: 'Running', podIP: WIRED_POD.ip, podIPs: [{ ip: WIRED_POD.ip }] },
    });
    await indexed;
    // What the kubelet does for the projected volume: a token the API server signs, bound to this pod.
    const tokenFile = join(tokenDir, 'token');
    await writeFile(
      tokenFile,
      api.issueToken(WIRED_POD.namespace, WIRED_POD.name, {
        audiences: [settings.audience],
        expirationSeconds: settings.expirationSeconds,
      }),
    );
    stamp(`kubelet (the demo): wrote the pod's signed token to a temp dir standing in for ${TOKEN_FILE}`);
    stamp(
      `pod ${WIRED_POD.namespace}/${WIRED_POD.name} starts the same JS SDK: default chain, metadata service disabled`,
    );
    const env = Object.fromEntries((app?.env ?? []).map((variable) => [variable.name, variable.value ?? '']));
    const wiredReport = await runPod(WIRED_POD.ip, [String(1_000), 'chain'], {
      ...env,
      AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE: tokenFile,
      AWS_EC2_METADATA_DISABLED: 'true',
      // The pod has no keys of its own: the agent's stand-in keys must not answer before the door.
      AWS_ACCESS_KEY_ID: undefined,
      AWS_SECRET_ACCESS_KEY: undefined,
    });
    if (wiredReport.kind === 'failed') return podFailed(wiredReport);
    const doorIssued = events.find(
      ({ event }) => event.type === 'credential.issued' && event.door === 'container' && event.pod === WIRED_POD.name,
    )?.event;
    stamp(
      `pod: the SDK has credentials ${wiredReport.accessKeyId.slice(0, 8)}… through the container door, ${Math.round(wiredReport.elapsedMs)} ms after it started`,
    );
    print('');
    print('Act two');
    print(`  role           ${doorIssued?.type === 'credential.issued' ? doorIssued.roleArn : '(none)'}`);
    print(
      `  door events    ${
        events
          .filter(({ event }) => event.door === 'container')
          .map(({ event }) => event.type)
          .join(', ') || '(none)'
      }`,
    );
    return doorIssued?.type === 'credential.issued' &&
      doorIssued.roleArn === `arn:aws:iam::${ACCOUNT}:role/${WIRED_POD.role}`
      ? 0
      : 1;
  } finally {
    await stopAgent();
    owned.unsubscribe();
    await Promise.all([api.stop(), sts.stop(), rm(tokenDir, { recursive: true, force: true })]);
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

/** A port free on 127.0.0.1 now, for the container door (whose Host check needs the port it listens on). */
function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer().once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port')),
      );
    });
  });
}

/** Forks the pod process (the module beside this one, .ts under tsx, .js when built) and resolves with its one report. */
function runPod(podIp: string, args: string[], env: Record<string, string | undefined>): Promise<PodReport> {
  const ownPath = fileURLToPath(import.meta.url);
  const podScript = ownPath.replace(/demo\.([jt]s)$/, 'demo-pod.$1');
  const merged = { ...process.env, ...env };
  for (const [name, value] of Object.entries(merged)) if (value === undefined) delete merged[name];
  const child = fork(podScript, [podIp, ...args], {
    env: merged,
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
