/**
 * `kube-iam-broker webhook-certs` as the Job runs it, in its own process, against an HTTP stand-in
 * for the few API server paths it uses (Secrets, the MutatingWebhookConfiguration, JSON patch as
 * the API server applies it). The Secrets and caBundle it leaves must verify each other; a second
 * run must change nothing.
 */
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { type IncomingMessage, type ServerResponse, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import fastJsonPatch from 'fast-json-patch';
import { parse } from 'yaml';

const ROOT = new URL('../../', import.meta.url);
const CLI = new URL('src/cli.ts', ROOT).pathname;
const NAMESPACE = 'kube-iam-broker';
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- AdmissionReview and pod JSON are read field by field in assertions
type Json = Record<string, any>;

describe('webhook-certs against the API server paths it uses', () => {
  const work = mkdtempSync(join(tmpdir(), 'kib-certs-'));
  const secrets = new Map<string, Json>();
  const writes: string[] = [];
  let configuration: Json;
  let resourceVersion = 1;
  const server = createServer((req, res) => void handle(req, res));

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let body = '';
    for await (const chunk of req) body += chunk;
    const send = (status: number, object: unknown) => {
      res.writeHead(status, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify(object));
    };
    const notFound = () =>
      send(404, { kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'NotFound', code: 404 });
    const url = new URL(req.url ?? '/', 'http://api');
    const secret = /^\/api\/v1\/namespaces\/([^/]+)\/secrets(?:\/([^/]+))?$/.exec(url.pathname);
    if (secret && secret[1] === NAMESPACE) {
      const name = secret[2];
      if (req.method === 'GET' && name) return secrets.has(name) ? send(200, secrets.get(name)) : notFound();
      const object = JSON.parse(body) as Json;
      if (req.method === 'POST' && !name) {
        if (secrets.has(object.metadata.name)) return send(409, { kind: 'Status', code: 409, reason: 'AlreadyExists' });
        writes.push(`create ${object.metadata.name}`);
      } else if (req.method === 'PUT' && name) {
        if (secrets.get(name)?.metadata.resourceVersion !== object.metadata.resourceVersion)
          return send(409, { kind: 'Status', code: 409, reason: 'Conflict' });
        writes.push(`replace ${name}`);
      } else return send(405, {});
      object.metadata.resourceVersion = String(++resourceVersion);
      secrets.set(object.metadata.name, object);
      return send(201, object);
    }
    if (url.pathname === '/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/kube-iam-broker') {
      if (req.method === 'GET') return send(200, configuration);
      if (req.method === 'PATCH') {
        assert.equal(req.headers['content-type'], 'application/json-patch+json');
        writes.push('patch configuration');
        configuration = fastJsonPatch.applyPatch(configuration, JSON.parse(body), true, false).newDocument;
        return send(200, configuration);
      }
    }
    return notFound();
  }

  const run = () =>
    new Promise<string>((resolve, reject) => {
      execFile(
        process.execPath,
        ['--import', 'tsx', CLI, 'webhook-certs', '--namespace', NAMESPACE],
        { cwd: ROOT, env: { ...process.env, KUBECONFIG: join(work, 'kubeconfig') }, timeout: 60_000 },
        (error, stdout, stderr) => (error ? reject(new Error(`${error.message}\n${stderr}`)) : resolve(stdout)),
      );
    });

  before(async () => {
    // The configuration as the manifests install it: two webhooks, no caBundle yet.
    const rendered = execFileSync('kubectl', ['kustomize', 'k8s/'], { cwd: ROOT, encoding: 'utf8' });
    configuration = rendered
      .split(/^---$/m)
      .map((text) => parse(text) as Json)
      .find((object) => object?.kind === 'MutatingWebhookConfiguration') as Json;
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    writeFileSync(
      join(work, 'kubeconfig'),
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [
          { name: 'stand-in', cluster: { server: `http://127.0.0.1:${port}`, 'insecure-skip-tls-verify': true } },
        ],
        users: [{ name: 'job', user: { token: 'job-token' } }],
        contexts: [{ name: 'stand-in', context: { cluster: 'stand-in', user: 'job' } }],
        'current-context': 'stand-in',
      }),
    );
  });

  after(async () => {
    await new Promise((resolve) => server.close(resolve));
    rmSync(work, { recursive: true, force: true });
  });

  it("creates the CA and serving Secrets and writes the CA into every webhook's caBundle", async () => {
    const report = JSON.parse(await run());
    assert.deepEqual(report.renewed, ['ca', 'serving']);
    assert.deepEqual(writes, [
      'create kube-iam-broker-webhook-ca',
      'create kube-iam-broker-webhook-tls',
      'patch configuration',
    ]);
    const decode = (name: string, key: string) => Buffer.from(secrets.get(name)?.data[key], 'base64').toString('utf8');
    const tls = secrets.get('kube-iam-broker-webhook-tls') as Json;
    assert.equal(tls.type, 'kubernetes.io/tls');
    assert.deepEqual(Object.keys(tls.data).sort(), ['ca.crt', 'tls.crt', 'tls.key']);
    assert.ok(!Object.keys(tls.data).includes('ca.key'), 'the mounted Secret holds no CA key');
    const serving = new X509Certificate(decode('kube-iam-broker-webhook-tls', 'tls.crt'));
    const ca = new X509Certificate(decode('kube-iam-broker-webhook-ca', 'tls.crt'));
    assert.ok(serving.checkIssued(ca) && serving.verify(ca.publicKey));
    assert.match(serving.subjectAltName ?? '', /DNS:kube-iam-broker-webhook\.kube-iam-broker\.svc(,|$)/);
    assert.equal(configuration.webhooks.length, 2);
    for (const webhook of configuration.webhooks)
      assert.equal(Buffer.from(webhook.clientConfig.caBundle, 'base64').toString('utf8'), ca.toString());
  });

  it('changes nothing when run again while everything is still good', async () => {
    writes.length = 0;
    const report = JSON.parse(await run());
    assert.deepEqual(report.renewed, []);
    assert.equal(report.caBundlePatched, 0);
    assert.deepEqual(writes, []);
  });
});
