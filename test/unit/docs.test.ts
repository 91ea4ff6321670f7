/** The README agrees with the code: generated tables up to date, no option that does not exist, the set-up commands real. */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { withGeneratedSections } from '../../src/config/docs.js';
import { optionEntries } from '../../src/config/schema.js';

const ROOT = new URL('../../', import.meta.url);
const readme = readFileSync(new URL('README.md', ROOT), 'utf8');

describe('README.md', () => {
  it('has the configuration and migration tables as src/config/schema.ts generates them (run npm run docs)', () => {
    assert.equal(readme, withGeneratedSections(readme));
  });

  it('lists every option and every kube2iam/kiam flag the agent accepts', () => {
    for (const [, spec] of optionEntries()) {
      assert.ok(readme.includes(`\`${spec.env}\``), spec.env);
      for (const alias of spec.aliases ?? []) assert.ok(readme.includes(`\`${alias.flag}`), alias.flag);
    }
  });

  it('mentions no BROKER_* variable that the agent does not know', () => {
    const known = new Set(optionEntries().map(([, spec]) => spec.env));
    const unknown = [...readme.matchAll(/\bBROKER_[A-Z0-9_]+/g)]
      .map(([name]) => name)
      .filter((name) => !known.has(name));
    assert.deepEqual([...new Set(unknown)], []);
  });

  it('gives the two set-up commands, and package.json has their scripts', () => {
    assert.match(readme, /^npm ci && npm run demo\b/m);
    assert.match(readme, /^npm ci && npm test\b/m);
    const { scripts } = JSON.parse(readFileSync(new URL('package.json', ROOT), 'utf8')) as {
      scripts: Record<string, string>;
    };
    for (const name of ['demo', 'test', 'docs']) assert.ok(scripts[name], `npm run ${name}`);
  });
});
