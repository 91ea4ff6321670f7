/**
 * The admission webhook as the API server meets it: `kube-iam-broker webhook` in its own process,
 * over TLS whose certificate the client checks against the CA `kube-iam-broker webhook-certs` made.
 * AdmissionReviews carry realistic pods; each returned patch is applied with a JSON-patch library
 * and the resulting pod is checked field by field, as the API server would persist it.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, symlinkSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import fastJsonPatch from 'fast-json-patch';
import { eventually } from '../../testkit/eventually.js';
import { WatchedProcess } from '../fixtures/output-watcher.js';

const ROOT = new URL('../../', import.meta.url);
const CLI = new URL('src/cli.ts', ROOT).pathname;
const URI = 'http://169.254.170.23/v1/credentials';
const TOKEN_FILE = '/var/run/secrets/kube-iam-broker.io/serviceaccount/token';
const MOUNT = {
  name: 'kube-iam-broker-token',
  mountPath: '/var/run/secrets/kube-iam-broker.io/serviceaccount',
  readOnly: true,
};
const VOLUME = (expirationSeconds = 3600) => ({
  name: 'kube-iam-broker-token',
  projected: { sources: [{ serviceAccountToken: { audience: 'kube-iam-broker', expirationSeconds, path: 'token' } }] },
});

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- AdmissionReview and pod JSON are read field by field in assertions
type Json = Record<string, any>;

/** What the kubelet does to a mounted Secret: files behind ..data, a symlink swapped atomically on rotation. */
function mountSecret(directory: string, from: string, generation: string): void {
  const version = join(directory, `..${generation}`);
  mkdirSync(version);
  for (const file of ['tls.crt', 'tls.key', 'ca.crt']) cpSync(join(from, file), join(version, file));
  symlinkSync(`..${generation}`, join(directory, '..data_tmp'));
  renameSync(join(directory, '..data_tmp'), join(directory, '..data'));
  for (const file of ['tls.crt', 'tls.key', 'ca.crt']) {
    try {
      symlinkSync(join('..data', file), join(directory, file));
    } catch {
      // Already linked through ..data by the first generation.
    }
  }
}

function makeCertificates(out: string): void {
  execFileSync(
    process.execPath,
    [
      '--import',
      'tsx',
      CLI,
      'webhook-certs',
      '--out',
      out,
      '--dns-name',
      'localhost',
      '--dns-name',
      'kube-iam-broker-webhook.kube-iam-broker.svc',
    ],
    { cwd: ROOT, stdio: 'pipe' },
  );
}

interface Answer {
  status: number;
  body: string;
}

describe('kube-iam-broker webhook (child process, TLS)', () => {
  const work = mkdtempSync(join(tmpdir(), 'kib-webhook-'));
  const mounted = join(work, 'mounted');
  let webhook: WatchedProcess;
  let port = 0;
  let ca = '';

  const send = (
    path: string,
    body: string | Buffer,
    options: { method?: string; ca?: string; contentType?: string } = {},
  ): Promise<Answer> =>
    new Promise((resolve, reject) => {
      const req = httpsRequest(
        {
          host: '127.0.0.1',
          port,
          path,
          method: options.method ?? 'POST',
          servername: 'localhost',
          ca: options.ca ?? ca,
          agent: false,
          headers: { 'Content-Type': options.contentType ?? 'application/json' },
          timeout: 10_000,
        },
        (res) => {
          let text = '';
          res.setEncoding('utf8').on('data', (chunk: string) => (text += chunk));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
        },
      );
      req.on('timeout', () => req.destroy(new Error('request timed out')));
      req.once('error', reject);
      req.end(body);
    });

  const review = (object: unknown, overrides: Json = {}) => ({
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: {
      uid: 'b1c8e5a0-4f7e-4f5e-9d51-7a1f1d2c3e4f',
      kind: { group: '', version: 'v1', kind: 'Pod' },
      resource: { group: '', version: 'v1', resource: 'pods' },
      operation: 'CREATE',
      namespace: 'payments',
      object,
      ...overrides,
    },
  });

  /** Sends the pod, checks the review's envelope, and returns the pod as the patch leaves it, with the warnings. */
  async function admit(pod: Json, path = '/mutate'): Promise<{ pod: Json; patched: boolean; warnings: string[] }> {
    const answer = await send(path, JSON.stringify(review(pod)));
    assert.equal(answer.status, 200, answer.body);
    const { response } = JSON.parse(answer.body) as {
      response: { uid: string; allowed: boolean; patchType?: string; patch?: string; warnings?: string[] };
    };
    assert.equal(response.uid, 'b1c8e5a0-4f7e-4f5e-9d51-7a1f1d2c3e4f');
    assert.equal(response.allowed, true);
    if (!response.patch) return { pod, patched: false, warnings: response.warnings ?? [] };
    assert.equal(response.patchType, 'JSONPatch');
    const operations = JSON.parse(Buffer.from(response.patch, 'base64').toString('utf8'));
    const result = fastJsonPatch.applyPatch(structuredClone(pod), operations, true, false).newDocument;
    return { pod: result, patched: true, warnings: response.warnings ?? [] };
  }

  before(async () => {
    makeCertificates(join(work, 'first'));
    mkdirSync(mounted);
    mountSecret(mounted, join(work, 'first'), 'gen1');
    ca = readFileSync(join(mounted, 'ca.crt'), 'utf8');
    webhook = WatchedProcess.spawn([process.execPath, '--import', 'tsx', CLI, 'webhook'], {
      ...process.env,
      BROKER_WEBHOOK_LISTEN: '127.0.0.1:0',
      BROKER_WEBHOOK_TLS_CERT: join(mounted, 'tls.crt'),
      BROKER_WEBHOOK_TLS_KEY: join(mounted, 'tls.key'),
      BROKER_LOG_LEVEL: 'debug',
    });
    const stdout = await webhook.waitFor((text) => /"msg":"webhook serving"/.test(text), 30_000);
    port = Number(/"listen":"127\.0\.0\.1:(\d+)"/.exec(stdout)?.[1]);
  });

  after(async () => {
    await webhook?.stop();
    rmSync(work, { recursive: true, force: true });
  });

  const realisticPod = (): Json => ({
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      generateName: 'checkout-7d9f8b6c4-',
      namespace: 'payments',
      labels: { app: 'checkout', 'pod-template-hash': '7d9f8b6c4' },
      annotations: { 'iam.amazonaws.com/role': 'checkout' },
    },
    spec: {
      serviceAccountName: 'checkout',
      initContainers: [
        { name: 'migrate', image: 'checkout:1.4', command: ['migrate', 'up'], env: [{ name: 'DB_HOST', value: 'db' }] },
      ],
      containers: [
        {
          name: 'app',
          image: 'checkout:1.4',
          env: [
            { name: 'HTTPS_PROXY', value: 'http://proxy.corp:3128' },
            { name: 'NO_PROXY', value: 'localhost,.svc,10.0.0.0/8' },
            { name: 'POD_IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
          ],
          volumeMounts: [
            { name: 'config', mountPath: '/etc/checkout' },
            { name: 'kube-api-access-x1', mountPath: '/var/run/secrets/kubernetes.io/serviceaccount', readOnly: true },
          ],
          ports: [{ containerPort: 8080 }],
        },
        { name: 'envoy', image: 'envoy:1.31', args: ['-c', '/etc/envoy.yaml'] },
      ],
      volumes: [
        { name: 'config', configMap: { name: 'checkout' } },
        {
          name: 'kube-api-access-x1',
          projected: { sources: [{ serviceAccountToken: { path: 'token', expirationSeconds: 3607 } }] },
        },
      ],
    },
  });

  it('wires every container and init container of a realistic pod, keeping what it had', async () => {
    const original = realisticPod();
    const { pod, patched, warnings } = await admit(original);
    assert.equal(patched, true);
    assert.deepEqual(warnings, []);
    const [app, envoy] = pod.spec.containers;
    assert.deepEqual(app.env, [
      { name: 'HTTPS_PROXY', value: 'http://proxy.corp:3128' },
      { name: 'NO_PROXY', value: 'localhost,.svc,10.0.0.0/8,169.254.170.23' },
      { name: 'POD_IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
      { name: 'AWS_CONTAINER_CREDENTIALS_FULL_URI', value: URI },
      { name: 'AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE', value: TOKEN_FILE },
    ]);
    assert.deepEqual(app.volumeMounts, [...original.spec.containers[0].volumeMounts, MOUNT]);
    assert.deepEqual(app.ports, [{ containerPort: 8080 }]);
    // No proxy set: no NO_PROXY added.
    assert.deepEqual(envoy.env, [
      { name: 'AWS_CONTAINER_CREDENTIALS_FULL_URI', value: URI },
      { name: 'AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE', value: TOKEN_FILE },
    ]);
    assert.deepEqual(envoy.volumeMounts, [MOUNT]);
    assert.deepEqual(envoy.args, ['-c', '/etc/envoy.yaml']);
    const [migrate] = pod.spec.initContainers;
    assert.deepEqual(migrate.env, [
      { name: 'DB_HOST', value: 'db' },
      { name: 'AWS_CONTAINER_CREDENTIALS_FULL_URI', value: URI },
      { name: 'AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE', value: TOKEN_FILE },
    ]);
    assert.deepEqual(migrate.volumeMounts, [MOUNT]);
    assert.deepEqual(pod.spec.volumes, [...original.spec.volumes, VOLUME()]);
    assert.deepEqual(pod.metadata.labels, { ...original.metadata.labels, 'kube-iam-broker.io/wired': 'true' });
    assert.deepEqual(pod.metadata.annotations, original.metadata.annotations);
    for (const container of [app, envoy, migrate]) {
      const names = container.env.map((variable: Json) => variable.name);
      assert.ok(
        !names.includes('AWS_CONTAINER_CREDENTIALS_RELATIVE_URI') &&
          !names.includes('AWS_CONTAINER_AUTHORIZATION_TOKEN'),
        container.name,
      );
    }
  });

  it('adds NO_PROXY and no_proxy when a container sets a proxy without them, and appends to no_proxy alone when only it is set', async () => {
    const base = realisticPod();
    base.spec.containers[0].env = [{ name: 'http_proxy', value: 'http://proxy:3128' }];
    base.spec.containers[1].env = [
      { name: 'HTTP_PROXY', value: 'http://proxy:3128' },
      { name: 'no_proxy', value: '' },
    ];
    const { pod } = await admit(base);
    const value = (container: Json, name: string) =>
      container.env.find((variable: Json) => variable.name === name)?.value;
    assert.equal(value(pod.spec.containers[0], 'NO_PROXY'), '169.254.170.23');
    assert.equal(value(pod.spec.containers[0], 'no_proxy'), '169.254.170.23');
    assert.equal(value(pod.spec.containers[1], 'no_proxy'), '169.254.170.23');
    assert.equal(value(pod.spec.containers[1], 'NO_PROXY'), undefined);
  });

  it('leaves containers with their own AWS credentials as they are, with a warning naming them', async () => {
    const base = realisticPod();
    base.spec.initContainers[0].env.push({
      name: 'AWS_ACCESS_KEY_ID',
      valueFrom: { secretKeyRef: { name: 'aws', key: 'id' } },
    });
    base.spec.containers[0].env.push(
      { name: 'AWS_WEB_IDENTITY_TOKEN_FILE', value: '/var/run/secrets/eks.amazonaws.com/serviceaccount/token' },
      { name: 'AWS_ROLE_ARN', value: 'arn:aws:iam::123456789012:role/x' },
    );
    base.spec.containers[1].env = [
      { name: 'AWS_CONTAINER_CREDENTIALS_FULL_URI', value: 'http://169.254.170.23/v1/credentials' },
      {
        name: 'AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE',
        value: '/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token',
      },
    ];
    const { patched, warnings, pod } = await admit(base);
    assert.equal(patched, false);
    assert.deepEqual(pod, base);
    assert.equal(warnings.length, 3);
    assert.match(warnings.find((w) => w.includes('"migrate"')) ?? '', /sets AWS_ACCESS_KEY_ID: left as it is/);
    assert.match(warnings.find((w) => w.includes('"app"')) ?? '', /sets AWS_WEB_IDENTITY_TOKEN_FILE: left as it is/);
    assert.match(
      warnings.find((w) => w.includes('"envoy"')) ?? '',
      /sets AWS_CONTAINER_CREDENTIALS_FULL_URI, AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE: left as it is/,
    );
  });

  it('wires the other containers when one has its own credentials', async () => {
    const base = realisticPod();
    base.spec.containers[1].env = [{ name: 'AWS_CONTAINER_CREDENTIALS_RELATIVE_URI', value: '/v2/credentials/abc' }];
    const { pod, warnings } = await admit(base);
    assert.deepEqual(pod.spec.containers[1], base.spec.containers[1]);
    assert.ok(
      pod.spec.containers[0].env.some((variable: Json) => variable.name === 'AWS_CONTAINER_CREDENTIALS_FULL_URI'),
    );
    assert.equal(warnings.length, 1);
    assert.match(warnings[0] as string, /"envoy" sets AWS_CONTAINER_CREDENTIALS_RELATIVE_URI/);
  });

  it('honours the opt-outs: inject "false" on the pod, skip-containers, and only "true" on the annotation path', async () => {
    const optedOut = realisticPod();
    optedOut.metadata.annotations['kube-iam-broker.io/inject'] = 'false';
    assert.deepEqual(await admit(optedOut), { pod: optedOut, patched: false, warnings: [] });

    const skipping = realisticPod();
    skipping.metadata.annotations['kube-iam-broker.io/skip-containers'] = 'envoy, migrate';
    const { pod } = await admit(skipping);
    assert.deepEqual(pod.spec.containers[1], skipping.spec.containers[1]);
    assert.deepEqual(pod.spec.initContainers, skipping.spec.initContainers);
    assert.ok(
      pod.spec.containers[0].env.some((variable: Json) => variable.name === 'AWS_CONTAINER_CREDENTIALS_FULL_URI'),
    );

    const unasked = realisticPod();
    assert.deepEqual(await admit(unasked, '/mutate/annotated'), { pod: unasked, patched: false, warnings: [] });
    const asked = realisticPod();
    asked.metadata.annotations['kube-iam-broker.io/inject'] = 'true';
    assert.equal((await admit(asked, '/mutate/annotated')).patched, true);
  });

  it('takes the token lifetime from the pod annotation, and warns about a bad one', async () => {
    const longer = realisticPod();
    longer.metadata.annotations['kube-iam-broker.io/token-expiration'] = '7200';
    assert.deepEqual((await admit(longer)).pod.spec.volumes.at(-1), VOLUME(7200));
    const bad = realisticPod();
    bad.metadata.annotations['kube-iam-broker.io/token-expiration'] = '60';
    const { pod, warnings } = await admit(bad);
    assert.deepEqual(pod.spec.volumes.at(-1), VOLUME(3600));
    assert.match(warnings[0] as string, /token-expiration="60" is not a number of seconds from 600 to 86400/);
  });

  it('adds nothing when re-invoked on its own output, and wires only a container another webhook added since', async () => {
    const once = (await admit(realisticPod())).pod;
    assert.deepEqual(await admit(once), { pod: once, patched: false, warnings: [] });
    once.spec.containers.push({
      name: 'istio-proxy',
      image: 'proxyv2:1.24',
      env: [{ name: 'ISTIO_META_MESH_ID', value: 'mesh' }],
    });
    const { pod, patched } = await admit(once);
    assert.equal(patched, true);
    assert.deepEqual(pod.spec.containers.slice(0, 2), once.spec.containers.slice(0, 2));
    assert.deepEqual(pod.spec.containers[2].env.slice(1), [
      { name: 'AWS_CONTAINER_CREDENTIALS_FULL_URI', value: URI },
      { name: 'AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE', value: TOKEN_FILE },
    ]);
    assert.deepEqual(pod.spec.volumes, once.spec.volumes, 'the volume is not added twice');
    assert.deepEqual(pod.metadata.labels, once.metadata.labels, 'the label is not added twice');
  });

  it("leaves a pod whose own volume has the token volume's name as it is", async () => {
    const base = realisticPod();
    base.spec.volumes.push({ name: 'kube-iam-broker-token', emptyDir: {} });
    const { patched, warnings } = await admit(base);
    assert.equal(patched, false);
    assert.match(warnings[0] as string, /volume "kube-iam-broker-token" exists/);
  });

  it('allows anything but a Pod CREATE untouched', async () => {
    for (const overrides of [
      { operation: 'UPDATE' },
      { kind: { group: 'apps', version: 'v1', kind: 'Deployment' } },
      { operation: 'CONNECT', object: undefined },
    ]) {
      const answer = await send('/mutate', JSON.stringify(review(realisticPod(), overrides)));
      assert.equal(answer.status, 200);
      assert.deepEqual(
        JSON.parse(answer.body).response,
        { uid: 'b1c8e5a0-4f7e-4f5e-9d51-7a1f1d2c3e4f', allowed: true },
        JSON.stringify(overrides),
      );
    }
  });

  it('answers malformed, truncated and wrongly shaped reviews with 400 and the reason', async () => {
    const full = JSON.stringify(review(realisticPod()));
    const truncated = await send('/mutate', full.slice(0, full.length / 2));
    assert.equal(truncated.status, 400);
    assert.match(JSON.parse(truncated.body).error, /^malformed JSON/);
    const wrongVersion = await send(
      '/mutate',
      JSON.stringify({ ...review(realisticPod()), apiVersion: 'admission.k8s.io/v1beta1' }),
    );
    assert.equal(wrongVersion.status, 400);
    assert.match(JSON.parse(wrongVersion.body).error, /apiVersion/);
    const noUid = await send(
      '/mutate',
      JSON.stringify({
        apiVersion: 'admission.k8s.io/v1',
        kind: 'AdmissionReview',
        request: { kind: { group: '', version: 'v1', kind: 'Pod' }, operation: 'CREATE' },
      }),
    );
    assert.equal(noUid.status, 400);
    assert.match(JSON.parse(noUid.body).error, /request\.uid/);
    assert.equal((await send('/mutate', full, { contentType: 'text/plain' })).status, 415);
    assert.equal((await send('/mutate', '', { method: 'GET' })).status, 405);
    // Still serving after all of it.
    assert.equal((await admit(realisticPod())).patched, true);
  });

  it('answers a pod CREATE that is not a valid pod with a warning and no patch, leaving the verdict to the API server', async () => {
    const answer = await send('/mutate', JSON.stringify(review({ metadata: { name: 'x' }, spec: { containers: [] } })));
    assert.equal(answer.status, 200);
    const { response } = JSON.parse(answer.body);
    assert.equal(response.patch, undefined);
    assert.match(response.warnings[0], /did not wire this pod: spec\.containers/);
  });

  it("wires a huge pod near the API server's size limit, and refuses a review above its own limit with 413", async () => {
    const huge = realisticPod();
    huge.spec.containers = Array.from({ length: 400 }, (_, index) => ({
      name: `c${index}`,
      image: 'busybox',
      env: Array.from({ length: 60 }, (_, variable) => ({ name: `VARIABLE_${variable}`, value: 'x'.repeat(80) })),
    }));
    const body = JSON.stringify(review(huge));
    assert.ok(body.length > 2_500_000 && body.length < 4_000_000, `review of ${body.length} bytes`);
    const { pod, patched } = await admit(huge);
    assert.equal(patched, true);
    assert.equal(
      pod.spec.containers.filter(
        (container: Json) => container.env.at(-1).name === 'AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE',
      ).length,
      400,
    );

    const tooLarge = await send('/mutate', Buffer.alloc(5 * 1024 * 1024, ' '));
    assert.equal(tooLarge.status, 413);
    assert.match(JSON.parse(tooLarge.body).error, /larger than 4194304 bytes/);
    assert.equal((await admit(realisticPod())).patched, true, 'still serving');
  });

  it('refuses plain HTTP', async () => {
    const outcome = await new Promise<string>((resolve) => {
      const req = httpRequest({ host: '127.0.0.1', port, path: '/healthz', agent: false, timeout: 5_000 }, (res) =>
        resolve(`answered ${res.statusCode}`),
      );
      req.on('timeout', () => req.destroy(new Error('timeout')));
      req.once('error', (error: NodeJS.ErrnoException) => resolve(error.code ?? error.message));
      req.end();
    });
    assert.ok(['ECONNRESET', 'HPE_INVALID_CONSTANT', 'EPIPE'].includes(outcome), `plain HTTP got: ${outcome}`);
  });

  it('serves health, readiness and metrics with the admissions counted by outcome', async () => {
    assert.equal((await send('/healthz', '', { method: 'GET' })).status, 200);
    assert.equal((await send('/readyz', '', { method: 'GET' })).status, 200);
    const metrics = (await send('/metrics', '', { method: 'GET' })).body;
    for (const outcome of ['wired', 'already-wired', 'left-as-is', 'opted-out', 'not-selected', 'ignored', 'invalid']) {
      assert.match(
        metrics,
        new RegExp(`kube_iam_broker_webhook_admissions_total\\{outcome="${outcome}"\\} [1-9]`),
        outcome,
      );
    }
    assert.match(metrics, /kube_iam_broker_webhook_certificate_not_after_seconds \d/);
  });

  it('picks up a rotated certificate from the mounted Secret without a restart', async () => {
    makeCertificates(join(work, 'second'));
    const newCa = readFileSync(join(work, 'second', 'ca.crt'), 'utf8');
    await assert.rejects(
      send('/healthz', '', { method: 'GET', ca: newCa }),
      /self.signed|unable to verify|certificate/i,
      'the new CA does not yet verify the server',
    );
    mountSecret(mounted, join(work, 'second'), 'gen2');
    await eventually(
      'the webhook serves the rotated certificate',
      async () => (await send('/healthz', '', { method: 'GET', ca: newCa }).catch(() => undefined))?.status === 200,
      15_000,
    );
    await assert.rejects(
      send('/healthz', '', { method: 'GET', ca }),
      /self.signed|unable to verify|certificate/i,
      'the old certificate is gone',
    );
    assert.equal(webhook.child.exitCode, null, 'no restart');
    assert.match(webhook.stdout, /"msg":"serving certificate reloaded"/);
  });
});
