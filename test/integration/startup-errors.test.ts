/**
 * What an operator sees when the agent cannot start: the real command, exit code 2 and one line on
 * stderr that says what to fix; never a stack trace, never "started" followed by a silent retry loop.
 */
import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { type Server, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { loadKubeConnection } from '../../src/cluster/kube-connection.js';
import { ConfigError } from '../../src/config/load.js';
import { WatchedProcess } from '../fixtures/output-watcher.js';

const CLI = ['node', '--import', 'tsx', new URL('../../src/cli.ts', import.meta.url).pathname];
/** tsx compiles the agent at every start, slowly on a loaded machine: this bounds a hung run, it is not a speed check. */
const RUN_TIMEOUT_MS = 90_000;

/** Nothing from the test runner's environment: no KUBECONFIG, no in-cluster variables, no AWS settings. */
const baseEnv = (): NodeJS.ProcessEnv => ({
  PATH: process.env.PATH,
  HOME: process.env.HOME,
  BROKER_METADATA_UPSTREAM: 'http://127.0.0.1:9',
  BROKER_BASE_ROLE_ARN: 'arn:aws:iam::123456789012:role/',
  BROKER_LISTEN: '127.0.0.1:0',
  BROKER_ADMIN_LISTEN: '127.0.0.1:0',
  BROKER_METRICS_LISTEN: '127.0.0.1:0',
});

const kubeconfigText = (server: string, context = 'test') => `apiVersion: v1
kind: Config
clusters: [{ name: ${context}, cluster: { server: "${server}" } }]
users: [{ name: ${context}, user: { token: abc } }]
contexts: [{ name: ${context}, context: { cluster: ${context}, user: ${context} } }]
current-context: ${context}
`;

async function failure(argv: string[], env: NodeJS.ProcessEnv): Promise<{ code: number; line: string }> {
  const child = WatchedProcess.spawn([...CLI, ...argv], env);
  const code = await child.exit(RUN_TIMEOUT_MS);
  // Node 20 also prints the AWS SDK's end-of-support notice on stderr; the agent's own line is the one that counts.
  const lines = child.stderr.split('\n').filter((line) => line.startsWith('kube-iam-broker'));
  assert.equal(lines.length, 1, `one line from the agent on stderr, got:\n${child.stderr}`);
  assert.doesNotMatch(child.stderr, /^\s+at /m, 'no stack trace');
  assert.doesNotMatch(child.stdout, /kube-iam-broker started/, 'never claims to have started');
  return { code, line: lines[0] as string };
}

describe('start-up errors: exit 2 and one line that says what to do', { timeout: 8 * RUN_TIMEOUT_MS }, () => {
  let dir: string;
  let goodKubeconfig: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'startup-errors-'));
    goodKubeconfig = join(dir, 'good');
    // An API server that is never reached: these tests end before the informers matter.
    writeFileSync(goodKubeconfig, kubeconfigText('http://127.0.0.1:9'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('no KUBECONFIG and not in a cluster', async () => {
    const { code, line } = await failure([], baseEnv());
    assert.equal(code, 2);
    assert.match(
      line,
      /^kube-iam-broker: invalid configuration: no in-cluster service account .* and no KUBECONFIG: run the agent in a pod, or set KUBECONFIG/,
    );
  });

  it('a kubeconfig that is missing, a directory, empty, malformed, or without a current context', async () => {
    const missing = await failure([], { ...baseEnv(), KUBECONFIG: join(dir, 'absent') });
    assert.equal(missing.code, 2);
    assert.match(
      missing.line,
      /^kube-iam-broker: invalid configuration: kubeconfig \S+absent does not exist: set KUBECONFIG/,
    );
    // The other cases take the same path out (a ConfigError); checked in-process, without a start each.
    const write = (name: string, text: string) => {
      writeFileSync(join(dir, name), text);
      return join(dir, name);
    };
    mkdirSync(join(dir, 'a-directory'));
    const cases: Array<[string, RegExp]> = [
      [join(dir, 'absent'), /kubeconfig \S+absent does not exist: set KUBECONFIG/],
      [join(dir, 'a-directory'), /kubeconfig \S+a-directory is a directory/],
      [write('empty', '\n'), /kubeconfig \S+empty is empty/],
      [write('malformed', 'clusters: [ {\n'), /kubeconfig \S+malformed is not a valid kubeconfig: /],
      [
        write('no-context', kubeconfigText('http://127.0.0.1:9').replace(/current-context: .*/, '')),
        /no current-context; set current-context/,
      ],
      [write('bad-server', kubeconfigText('not a url')), /has server "not a url", not a URL/],
    ];
    for (const [path, expected] of cases) {
      assert.throws(
        () => loadKubeConnection(path),
        (error: unknown) =>
          error instanceof ConfigError && expected.test(error.message) && !error.message.includes('\n'),
        path,
      );
    }
  });

  it('a port out of range, caught by the schema', async () => {
    const { code, line } = await failure([], {
      ...baseEnv(),
      KUBECONFIG: goodKubeconfig,
      BROKER_ADMIN_LISTEN: '127.0.0.1:70000',
    });
    assert.equal(code, 2);
    assert.equal(
      line,
      'kube-iam-broker: invalid configuration: BROKER_ADMIN_LISTEN (--admin-listen): expected a port from 0 to 65535',
    );
  });

  it('a port in use', async () => {
    const holder: Server = createServer();
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
    try {
      const port = (holder.address() as { port: number }).port;
      const { code, line } = await failure(['--app-port', String(port)], {
        ...baseEnv(),
        KUBECONFIG: goodKubeconfig,
        BROKER_LISTEN: '',
      });
      assert.equal(code, 2);
      assert.match(
        line,
        new RegExp(
          `^kube-iam-broker: invalid configuration: BROKER_LISTEN 0\\.0\\.0\\.0:${port} is already in use by another process`,
        ),
      );
    } finally {
      await new Promise((resolve) => holder.close(resolve));
    }
  });

  it('no NET_ADMIN: the right message without a stack trace', async () => {
    // iptables as an unprivileged container runs it: refused by the kernel.
    const iptables = join(dir, 'iptables');
    writeFileSync(
      iptables,
      '#!/bin/sh\necho "iptables v1.8.9 (nf_tables): Could not fetch rule set generation id: Permission denied (you must be root)" >&2\nexit 4\n',
    );
    chmodSync(iptables, 0o755);
    const env = {
      ...baseEnv(),
      KUBECONFIG: goodKubeconfig,
      BROKER_IPTABLES: 'true',
      BROKER_IPTABLES_BINARY: iptables,
      BROKER_HOST_INTERFACE: 'veth+',
      BROKER_HOST_IP: '10.0.1.23',
    };
    const { code, line } = await failure([], env);
    assert.equal(code, 2);
    assert.match(
      line,
      /^kube-iam-broker: .*was refused \(.*Permission denied.*\): the agent needs the NET_ADMIN capability and hostNetwork$/,
    );
  });

  it('merges a KUBECONFIG list as kubectl does: the first file that sets a value wins', () => {
    const first = join(dir, 'first');
    const second = join(dir, 'second');
    writeFileSync(first, kubeconfigText('http://127.0.0.1:1111', 'shared').replace(/current-context: .*/, ''));
    writeFileSync(second, `${kubeconfigText('http://127.0.0.1:2222', 'shared')}`);
    const merged = loadKubeConnection(`${first}:${second}`);
    assert.equal(
      merged.server,
      'http://127.0.0.1:1111',
      'the current context from the second file, the first having none; the cluster named in both from the first',
    );
  });
});

describe('`events --follow` against an unreachable agent', { timeout: 2 * RUN_TIMEOUT_MS }, () => {
  it('says it is retrying', async () => {
    const closed: Server = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as { port: number }).port;
    await new Promise((resolve) => closed.close(resolve));
    const follow = WatchedProcess.spawn([...CLI, 'events', '--follow', '--admin', `127.0.0.1:${port}`], {
      PATH: process.env.PATH,
    });
    try {
      const deadline = Date.now() + RUN_TIMEOUT_MS;
      while (!/retrying in \d+ ms \(attempt 2 of 10\)/.test(follow.stderr) && Date.now() < deadline)
        await new Promise((resolve) => setTimeout(resolve, 50));
      assert.match(
        follow.stderr,
        new RegExp(
          `kube-iam-broker events: cannot reach the agent at 127\\.0\\.0\\.1:${port} \\(.*ECONNREFUSED.*\\); retrying in \\d+ ms \\(attempt 1 of 10\\)`,
        ),
      );
      assert.match(follow.stderr, /\(attempt 2 of 10\)/);
    } finally {
      await follow.stop();
    }
  });
});
