/**
 * `npm run demo` as a new user runs it (right after `npm ci`, no build): a child process whose
 * output must tell the startup-race story in order, and whose exit code must be 0.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';

const ROOT = new URL('../../', import.meta.url);
const { version } = JSON.parse(readFileSync(new URL('package.json', ROOT), 'utf8')) as { version: string };
/** tsx starts slowly on a loaded machine; this bounds a hung run, it is not a speed check. */
const RUN_TIMEOUT_MS = 120_000;

interface Run {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  /** stdout as it arrived, one entry per read. */
  readonly chunks: readonly string[];
}

function run(command: string, args: string[], env: Record<string, string> = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {
      cwd: ROOT,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const chunks: string[] = [];
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => chunks.push(chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    const killer = setTimeout(() => child.kill('SIGKILL'), RUN_TIMEOUT_MS);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(killer);
      resolve({ code, stdout: chunks.join(''), stderr, chunks });
    });
  });
}

describe('npm run demo', () => {
  it(
    'shows a pod that asked before it existed being answered by push, then a webhook-wired pod served by the container door, and exits 0',
    { timeout: RUN_TIMEOUT_MS + 10_000 },
    async () => {
      // A generous grace window keeps the story the same on a machine busy with other test runs.
      const { code, stdout, stderr, chunks } = await run('npm', ['run', '--silent', 'demo'], {
        BROKER_GRACE_WINDOW_MS: '5000',
      });
      assert.equal(code, 0, `exit code\n${stdout}\n${stderr}`);
      // Progress shows while it runs: the story's start was printed before the summary was written.
      const chunkWith = (text: string) => chunks.findIndex((chunk) => chunk.includes(text));
      assert.ok(
        chunkWith("pod's request arrived") < chunkWith('Summary'),
        'the output arrives as it happens, not all at the end',
      );
      const lines = stdout.split('\n');
      assert.match(lines[0] ?? '', new RegExp(`^kube-iam-broker ${version.replace(/\./g, '\\.')} demo`));
      const index = (pattern: RegExp) => {
        const found = lines.findIndex((line) => pattern.test(line));
        assert.ok(found >= 0, `no line matches ${pattern}\n${stdout}`);
        return found;
      };
      const arrived = index(
        /pod's request arrived: GET \/latest\/meta-data\/iam\/security-credentials\/; pod known for 127\.0\.0\.2: no/,
      );
      const created = index(/cluster: pod shop\/checkout created with IP 127\.0\.0\.2/);
      const waited = index(/event +lookup\.waited +127\.0\.0\.2 shop\/checkout .*outcome: push/);
      const issued = index(
        /event +credential\.issued +127\.0\.0\.2 shop\/checkout +role arn:aws:iam::123456789012:role\/checkout-reader/,
      );
      const gotCredentials = index(/pod: the SDK has credentials ASIA/);
      assert.ok(
        arrived < created && created < waited && waited < issued && issued < gotCredentials,
        `the story is out of order\n${stdout}`,
      );
      index(/event +token\.issued +127\.0\.0\.2/);
      index(/event +pod\.indexed +127\.0\.0\.2 shop\/checkout/);

      const summary = stdout.slice(stdout.indexOf('Summary'));
      assert.match(summary, /role +arn:aws:iam::123456789012:role\/checkout-reader/);
      assert.match(summary, /session name +shop@checkout/);
      assert.match(summary, /resolved by +push, [\d.]+ ms after the pod event/);
      const waitedMs = Number(/waited ms +(\d+)/.exec(summary)?.[1]);
      // The pod object appears 100 ms after the request arrives, so the request waited at least that.
      assert.ok(waitedMs >= 100, `waited ${waitedMs} ms`);
      assert.doesNotMatch(stdout + stderr, /169\.254\.169\.254/);

      // Act two: the webhook's patch wires the pod, and the same SDK gets its role through the container door.
      const act = stdout.slice(stdout.indexOf('act two:'));
      const door = /container (127\.0\.0\.1:\d+), admin/.exec(stdout)?.[1];
      assert.ok(door, `the agent's container door is listed\n${stdout}`);
      const uri = `http://${door}/v1/credentials`;
      const actIndex = (pattern: RegExp) => {
        const found = act.split('\n').findIndex((line) => pattern.test(line));
        assert.ok(found >= 0, `act two has no line matching ${pattern}\n${act}`);
        return found;
      };
      const wired = actIndex(/webhook: wired, a JSON patch of \d+ operations/);
      assert.ok(act.includes(`env    AWS_CONTAINER_CREDENTIALS_FULL_URI=${uri}\n`), `the URI of the door\n${act}`);
      actIndex(
        /env +AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=\/var\/run\/secrets\/kube-iam-broker\.io\/serviceaccount\/token$/,
      );
      actIndex(
        /volume kube-iam-broker-token: .*"serviceAccountToken":\{"audience":"kube-iam-broker","expirationSeconds":3600/,
      );
      const doorIssued = actIndex(
        /event \(container door\) +credential\.issued +\S+ shop\/reports +role arn:aws:iam::123456789012:role\/reports-writer/,
      );
      const doorCredentials = actIndex(/pod: the SDK has credentials ASIA\w+… through the container door/);
      assert.ok(wired < doorIssued && doorIssued < doorCredentials, `act two is out of order\n${act}`);
      const actSummary = act.slice(act.indexOf('Act two'));
      assert.match(actSummary, /role +arn:aws:iam::123456789012:role\/reports-writer/);
      assert.match(actSummary, /door events +credential\.issued/);

      // The README shows the demo as it prints it: the same lines, only numbers, ports and keys differ.
      const readme = readFileSync(new URL('README.md', ROOT), 'utf8');
      const shown = /is answered by push[^\n]*\n\n```\n([\s\S]*?)```/.exec(readme)?.[1];
      assert.ok(shown, 'the README has the demo output block');
      const shape = (text: string) =>
        text
          .trim()
          .split('\n')
          .map((line) =>
            line
              .replace(/ASIA[A-Z0-9]+…/g, 'ASIA…')
              .replace(/\d{4}-\d\d-\d\dT[\d:.]+Z/g, 'TIME')
              .replace(/\d+(\.\d+)?/g, 'N')
              .replace(/ +/g, ' '),
          );
      assert.deepEqual(shape(shown), shape(stdout));
    },
  );

  it('prints the package version with --version', { timeout: RUN_TIMEOUT_MS }, async () => {
    const { code, stdout } = await run('npx', ['tsx', 'src/cli.ts', '--version']);
    assert.equal(code, 0);
    assert.equal(stdout.trim(), version);
  });
});
