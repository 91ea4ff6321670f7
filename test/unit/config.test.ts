import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ConfigError, loadConfig } from '../../src/config/load.js';
import { helpText } from '../../src/config/help.js';
import { flagOf, optionEntries } from '../../src/config/schema.js';

describe('configuration', () => {
  it('has the documented defaults', () => {
    const config = loadConfig([], {});
    assert.equal(config.graceWindowMs, undefined, 'unset: holds come from the SDK table (300 ms for unrecognised clients)');
    assert.equal(config.listen, '0.0.0.0:8181');
    assert.equal(config.adminListen, '127.0.0.1:8182');
    assert.equal(config.roleAnnotation, 'iam.amazonaws.com/role');
    assert.equal(config.sessionDurationSeconds, 3600);
    assert.equal(config.imdsTokens, 'optional');
    assert.equal(config.defaultRole, undefined);
  });

  it('reads BROKER_* variables and lets flags override them', () => {
    const config = loadConfig(['--grace-window-ms', '450', '--default-role=fallback'], { BROKER_GRACE_WINDOW_MS: '200', BROKER_NODE_NAME: 'node-a' });
    assert.equal(config.graceWindowMs, 450);
    assert.equal(config.defaultRole, 'fallback');
    assert.equal(config.nodeName, 'node-a');
  });

  it('accepts kube2iam and kiam flag names with their value forms', () => {
    const config = loadConfig(['--app-port', '8282', '--base-role-arn', 'arn:aws:iam::123456789012:role', '--iam-role-key', 'example.com/role', '--node', 'n1', '--metadata-addr', '127.0.0.1:9999', '--allow-route-regexp', '^$'], {});
    assert.equal(config.listen, '0.0.0.0:8282');
    assert.equal(config.baseRoleArn, 'arn:aws:iam::123456789012:role/');
    assert.equal(config.roleAnnotation, 'example.com/role');
    assert.equal(config.nodeName, 'n1');
    assert.equal(config.metadataUpstream, 'http://127.0.0.1:9999');
    assert.equal(config.metadataAllow, '^$');
  });

  it('takes kube2iam\'s namespace-restriction flags as they are, off by default', () => {
    const defaults = loadConfig([], {});
    assert.deepEqual([defaults.namespaceRestrictions, defaults.namespaceRestrictionFormat, defaults.namespaceKey], [false, 'glob', 'iam.amazonaws.com/allowed-roles']);
    const kube2iam = loadConfig(['--namespace-restrictions', '--namespace-restriction-format', 'regexp', '--namespace-key=example.com/roles'], {});
    assert.deepEqual([kube2iam.namespaceRestrictions, kube2iam.namespaceRestrictionFormat, kube2iam.namespaceKey], [true, 'regexp', 'example.com/roles']);
    assert.throws(() => loadConfig([], { BROKER_NAMESPACE_RESTRICTION_FORMAT: 'regex' }), /BROKER_NAMESPACE_RESTRICTION_FORMAT/);
  });

  it('reports every bad value at once, naming the variable and flag', () => {
    assert.throws(
      () => loadConfig(['--bogus', '--imds-tokens', 'sometimes'], { BROKER_GRACE_WINDOW_MS: '-5', BROKER_SESSION_DURATION: '5m', BROKER_METADATA_ALLOW: '(' }),
      (error: unknown) => {
        assert.ok(error instanceof ConfigError);
        const text = error.problems.join('\n');
        for (const expected of ['--bogus', 'BROKER_IMDS_TOKENS (--imds-tokens)', 'BROKER_GRACE_WINDOW_MS', 'BROKER_SESSION_DURATION', 'BROKER_METADATA_ALLOW']) assert.match(text, new RegExp(expected.replace(/[()]/g, '\\$&')));
        return true;
      },
    );
  });

  it('lists every option with its variable, flag and default in --help', () => {
    const help = helpText('0.0.0');
    for (const [, spec] of optionEntries()) {
      assert.ok(help.includes(spec.env), spec.env);
      assert.ok(help.includes(flagOf(spec)), flagOf(spec));
      if (spec.default !== undefined) assert.ok(help.includes(`default ${spec.default}`), `${spec.env} default`);
    }
  });
});
