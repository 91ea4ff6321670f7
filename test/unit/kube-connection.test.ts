/** The kubeconfig / service-account loader: what it accepts, what it refuses and how it says so. */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { kubeconfigConnection, loadKubeConnection } from '../../src/cluster/kube-connection.js';

const kubeconfig = (
  user: Record<string, unknown>,
  cluster: Record<string, unknown> = { server: 'https://10.0.0.1:6443/' },
) =>
  JSON.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    'current-context': 'ops',
    contexts: [{ name: 'ops', context: { cluster: 'prod', user: 'agent' } }],
    clusters: [{ name: 'prod', cluster }],
    users: [{ name: 'agent', user }],
  });

describe('kubeconfig connection', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kib-kubeconfig-'));
  });
  after(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("uses the current context's server and token", () => {
    const kube = kubeconfigConnection(kubeconfig({ token: 'abc' }), dir);
    assert.equal(kube.server, 'https://10.0.0.1:6443');
    assert.equal(kube.authorization(), 'Bearer abc');
  });

  it('re-reads a token file (relative to the kubeconfig) for every request, as projected tokens rotate', async () => {
    await writeFile(join(dir, 'token'), 'first\n');
    const kube = kubeconfigConnection(kubeconfig({ tokenFile: 'token' }), dir);
    assert.equal(kube.authorization(), 'Bearer first');
    await writeFile(join(dir, 'token'), 'second\n');
    assert.equal(kube.authorization(), 'Bearer second');
  });

  it('reads YAML as kubectl writes it, with a CA file relative to the kubeconfig', async () => {
    await writeFile(join(dir, 'ca.crt'), '-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n');
    const path = join(dir, 'config');
    await writeFile(
      path,
      [
        'current-context: ops',
        'contexts:',
        '- name: ops',
        '  context: {cluster: prod, user: agent}',
        'clusters:',
        '- name: prod',
        '  cluster:',
        '    server: https://api.example:443',
        '    certificate-authority: ca.crt',
        'users:',
        '- name: agent',
        '  user: {token: t}',
        '',
      ].join('\n'),
    );
    const kube = loadKubeConnection(path);
    assert.equal(kube.server, 'https://api.example:443');
    assert.equal(kube.authorization(), 'Bearer t');
  });

  it('refuses an exec plugin with a clear error instead of connecting unauthenticated', () => {
    assert.throws(
      () => kubeconfigConnection(kubeconfig({ exec: { command: 'aws', args: ['eks', 'get-token'] } }), dir),
      /exec plugin or auth provider.*token, tokenFile or client certificate/,
    );
  });

  it('names what is missing or malformed', () => {
    const noContext = JSON.stringify({ 'current-context': 'gone', contexts: [], clusters: [], users: [] });
    assert.throws(
      () => kubeconfigConnection(noContext, dir, '/etc/kubeconfig'),
      /\/etc\/kubeconfig: current-context gone is not among its contexts/,
    );
    assert.throws(
      () => kubeconfigConnection(kubeconfig({}, { server: 'not a url' }), dir),
      /cluster "prod" has server "not a url", not a URL/,
    );
  });

  it('outside a pod and without KUBECONFIG, says which variables it looked for', () => {
    assert.throws(
      () => loadKubeConnection(undefined, {}),
      /no in-cluster service account \(KUBERNETES_SERVICE_HOST\/PORT unset.*set KUBECONFIG/,
    );
  });
});

describe('KUBECONFIG with several files', () => {
  it('merges them as kubectl does: the first file that sets a value wins', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kib-kubeconfig-merge-'));
    try {
      const first = join(dir, 'first');
      const second = join(dir, 'second');
      await writeFile(
        first,
        JSON.stringify({ 'current-context': 'ops', users: [{ name: 'agent', user: { token: 'from-first' } }] }),
      );
      await writeFile(second, kubeconfig({ token: 'from-second' }));
      const kube = loadKubeConnection(`${first}:${second}`);
      assert.equal(kube.server, 'https://10.0.0.1:6443');
      assert.equal(kube.authorization(), 'Bearer from-first');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
