import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ConfigError, loadConfig, resolveConfig } from '../../src/config/load.js';
import { effectiveConfiguration } from '../../src/config/effective.js';
import { helpText } from '../../src/config/help.js';
import { flagOf, optionEntries } from '../../src/config/schema.js';

describe('configuration', () => {
  it('has the documented defaults', () => {
    const config = loadConfig([], {});
    assert.equal(
      config.graceWindowMs,
      undefined,
      'unset: holds come from the SDK table (300 ms for unrecognised clients)',
    );
    assert.equal(config.listen, '0.0.0.0:8181');
    assert.equal(config.adminListen, '127.0.0.1:8182');
    assert.equal(config.roleAnnotation, 'iam.amazonaws.com/role');
    assert.equal(config.sessionDurationSeconds, 3600);
    assert.equal(config.imdsTokens, 'optional');
    assert.equal(config.defaultRole, undefined);
  });

  it('reads BROKER_* variables and lets flags override them', () => {
    const config = loadConfig(['--grace-window-ms', '450', '--default-role=fallback'], {
      BROKER_GRACE_WINDOW_MS: '200',
      BROKER_NODE_NAME: 'node-a',
    });
    assert.equal(config.graceWindowMs, 450);
    assert.equal(config.defaultRole, 'fallback');
    assert.equal(config.nodeName, 'node-a');
  });

  it('accepts kube2iam and kiam flag names with their value forms', () => {
    const config = loadConfig(
      [
        '--app-port',
        '8282',
        '--base-role-arn',
        'arn:aws:iam::123456789012:role',
        '--iam-role-key',
        'example.com/role',
        '--node',
        'n1',
        '--metadata-addr',
        '127.0.0.1:9999',
        '--allow-route-regexp',
        '^$',
      ],
      {},
    );
    assert.equal(config.listen, '0.0.0.0:8282');
    assert.equal(config.baseRoleArn, 'arn:aws:iam::123456789012:role/');
    assert.equal(config.roleAnnotation, 'example.com/role');
    assert.equal(config.nodeName, 'n1');
    assert.equal(config.metadataUpstream, 'http://127.0.0.1:9999');
    assert.equal(config.metadataAllow, '^(?:^$)$');
  });

  it("takes kube2iam's namespace-restriction flags as they are, off by default", () => {
    const defaults = loadConfig([], {});
    assert.deepEqual(
      [defaults.namespaceRestrictions, defaults.namespaceRestrictionFormat, defaults.namespaceKey],
      [false, 'glob', 'iam.amazonaws.com/allowed-roles'],
    );
    const kube2iam = loadConfig(
      ['--namespace-restrictions', '--namespace-restriction-format', 'regexp', '--namespace-key=example.com/roles'],
      {},
    );
    assert.deepEqual(
      [kube2iam.namespaceRestrictions, kube2iam.namespaceRestrictionFormat, kube2iam.namespaceKey],
      [true, 'regexp', 'example.com/roles'],
    );
    assert.throws(
      () => loadConfig([], { BROKER_NAMESPACE_RESTRICTION_FORMAT: 'regex' }),
      /BROKER_NAMESPACE_RESTRICTION_FORMAT/,
    );
  });

  it('reports every bad value at once, naming the variable and flag', () => {
    assert.throws(
      () =>
        loadConfig(['--bogus', '--imds-tokens', 'sometimes'], {
          BROKER_GRACE_WINDOW_MS: '-5',
          BROKER_SESSION_DURATION: '5m',
          BROKER_METADATA_ALLOW: '(',
        }),
      (error: unknown) => {
        assert.ok(error instanceof ConfigError);
        const text = error.problems.join('\n');
        for (const expected of [
          '--bogus',
          '--imds-tokens=sometimes (BROKER_IMDS_TOKENS)',
          'BROKER_GRACE_WINDOW_MS',
          'BROKER_SESSION_DURATION',
          'BROKER_METADATA_ALLOW',
        ])
          assert.match(text, new RegExp(expected.replace(/[()]/g, '\\$&')));
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

  it('refuses an unknown BROKER_* variable, naming the closest known one', () => {
    const problemsOf = (env: Record<string, string>) => {
      try {
        loadConfig([], env);
        return [];
      } catch (error) {
        assert.ok(error instanceof ConfigError);
        return [...error.problems];
      }
    };
    const problems = problemsOf({
      BROKER_NAMESPACE_RESTRICTION: 'true',
      BROKER_GRACE_WINDOW: '500',
      BROKER_ZZZ_WHATEVER_ELSE: '1',
      PATH: '/bin',
      KUBE2IAM_ANYTHING: 'x',
    });
    assert.equal(problems.length, 3, problems.join('\n'));
    assert.match(
      problems[0] as string,
      /^unknown variable BROKER_GRACE_WINDOW \(did you mean BROKER_GRACE_WINDOW_MS\?\)/,
    );
    assert.match(
      problems[1] as string,
      /^unknown variable BROKER_NAMESPACE_RESTRICTION \(did you mean BROKER_NAMESPACE_RESTRICTIONS\?\)/,
    );
    assert.match(
      problems[2] as string,
      /^unknown variable BROKER_ZZZ_WHATEVER_ELSE: /,
      'no suggestion when nothing is close',
    );
    assert.deepEqual(problemsOf({ BROKER_NAMESPACE_RESTRICTIONS: 'true' }), []);
  });

  it("shows the effective configuration with each value's source and secrets redacted", () => {
    const resolved = resolveConfig(['--grace-window-ms=250', '--app-port', '8282'], {
      BROKER_ADMIN_TOKEN: 'a-secret-token-of-32-characters!',
      BROKER_NODE_NAME: 'node-a',
      KUBECONFIG: '/etc/kube/config',
    });
    const effective = effectiveConfiguration(resolved);
    assert.deepEqual(effective.BROKER_GRACE_WINDOW_MS, { value: 250, source: '--grace-window-ms' });
    assert.deepEqual(effective.BROKER_LISTEN, { value: '0.0.0.0:8282', source: '--app-port' });
    assert.deepEqual(effective.BROKER_NODE_NAME, { value: 'node-a', source: 'BROKER_NODE_NAME' });
    assert.deepEqual(effective.BROKER_KUBECONFIG, { value: '/etc/kube/config', source: 'KUBECONFIG' });
    assert.deepEqual(effective.BROKER_ADMIN_TOKEN, { value: '(redacted)', source: 'BROKER_ADMIN_TOKEN' });
    assert.deepEqual(effective.BROKER_DEFAULT_ROLE, { value: null, source: 'default' });
    assert.ok(!JSON.stringify(effective).includes('a-secret-token'), 'the token appears nowhere');
    assert.deepEqual(
      Object.keys(effective).sort(),
      optionEntries()
        .map(([, spec]) => spec.env)
        .sort(),
      'every option, once',
    );
  });

  it('catches a port out of range in the schema, naming the option', () => {
    assert.throws(
      () => loadConfig([], { BROKER_METRICS_LISTEN: '0.0.0.0:65536' }),
      /BROKER_METRICS_LISTEN \(--metrics-listen\): expected a port from 0 to 65535/,
    );
    assert.equal(loadConfig([], { BROKER_METRICS_LISTEN: '0.0.0.0:65535' }).metricsListen, '0.0.0.0:65535');
  });

  it('matches BROKER_METADATA_ALLOW against the whole path', () => {
    const allow = new RegExp(
      loadConfig([], { BROKER_METADATA_ALLOW: '/latest/meta-data/instance-id|/latest/meta-data/ami-id' }).metadataAllow,
    );
    assert.ok(allow.test('/latest/meta-data/instance-id'));
    assert.ok(allow.test('/latest/meta-data/ami-id'));
    for (const path of [
      '/latest/meta-data/instance-id/x',
      '/x/latest/meta-data/instance-id',
      '/latest/meta-data/ami-id-extra',
    ])
      assert.ok(!allow.test(path), path);
  });

  it('warns that a secret given as a flag shows in the process list', () => {
    const { warnings, config } = resolveConfig(['--admin-token', 'a-secret-token-of-32-characters!'], {});
    assert.equal(config.adminToken, 'a-secret-token-of-32-characters!');
    assert.deepEqual(warnings, [
      '--admin-token on the command line shows in the process list (ps, /proc/PID/cmdline) to everyone on the node: pass BROKER_ADMIN_TOKEN in the environment (from a Secret) instead',
    ]);
    assert.deepEqual(resolveConfig([], { BROKER_ADMIN_TOKEN: 'a-secret-token-of-32-characters!' }).warnings, []);
  });
});
