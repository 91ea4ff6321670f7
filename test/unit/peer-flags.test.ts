/**
 * kube2iam's and kiam's own arguments: every flag kube2iam 0.15 has (read from the real binary's
 * --help, built by ../shared/peers/kube2iam/build.sh; see .ci/run) is accepted with its meaning,
 * warned as without effect, or refused with the reason, and errors name the flag the user typed.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { ConfigError, loadConfig, resolveConfig } from '../../src/config/load.js';

const KUBE2IAM = process.env.KUBE2IAM_BINARY ?? fileURLToPath(new URL('../../../kube2iam/kube2iam', import.meta.url));

/** `--flag type  help (default "x")` lines of pflag's usage; --help exits 2 by design. */
function kube2iamFlags(): Array<{ flag: string; type: string | undefined; defaultValue: string | undefined }> {
  assert.ok(
    existsSync(KUBE2IAM),
    `no kube2iam binary at ${KUBE2IAM}: build it with bash ../shared/peers/kube2iam/build.sh ${KUBE2IAM} (.ci/run does)`,
  );
  let usage: string;
  try {
    usage = execFileSync(KUBE2IAM, ['--help'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (error) {
    usage = String((error as { stderr?: string }).stderr ?? '') + String((error as { stdout?: string }).stdout ?? '');
  }
  return [...usage.matchAll(/^\s+(--[a-z-]+)(?: (string|duration))?\s+.*?(?:\(default "?([^")]*)"?\))?$/gm)].map(
    (match) => ({
      flag: match[1] as string,
      type: match[2],
      defaultValue: match[3],
    }),
  );
}

/** Values for flags that have no default in kube2iam. */
const SAMPLES: Record<string, string> = {
  '--base-role-arn': 'arn:aws:iam::123456789012:role/',
  '--default-role': 'fallback',
  '--host-ip': '10.0.1.23',
  '--kubeconfig': '/etc/kubernetes/kubeconfig',
  '--node': 'node-a',
  '--iam-role-error-ttl': '0s',
  // kube2iam's 15m means 30-minute sessions handed out with 15 min left, too little for botocore (see below).
  '--iam-role-session-ttl': '30m',
};
/** Flags whose effect the agent cannot give, refused with the reason; all others must be accepted. */
const REFUSED = ['--api-server', '--api-token', '--auto-discover-default-role', '--insecure'];

const problemsOf = (argv: string[], env: NodeJS.ProcessEnv = {}): string[] => {
  try {
    resolveConfig(argv, env);
    return [];
  } catch (error) {
    assert.ok(error instanceof ConfigError, String(error));
    return [...error.problems];
  }
};

describe('kube2iam 0.15 flags', () => {
  const flags = kube2iamFlags().filter(({ flag }) => flag !== '--version'); // the CLI prints the version before reading options

  it("knows all of them, from the real binary's --help", () => {
    assert.ok(flags.length >= 30, `read ${flags.length} flags`);
    const argv = flags.map(({ flag, type, defaultValue }) =>
      type === undefined ? flag : `${flag}=${SAMPLES[flag] ?? defaultValue ?? 'x'}`,
    );
    const problems = problemsOf(argv);
    assert.deepEqual(
      problems.map((problem) => /^(--[a-z-]+)/.exec(problem)?.[1]),
      REFUSED,
      problems.join('\n'),
    );
    for (const problem of problems) assert.match(problem, /is not supported: .+/);
    const { config, warnings } = resolveConfig(
      argv.filter((arg) => !REFUSED.some((flag) => arg.startsWith(flag))),
      {},
    );
    assert.equal(
      config.sessionDurationSeconds,
      3600,
      '--iam-role-session-ttl=30m: STS is asked for twice the cache TTL',
    );
    assert.equal(config.listen, '0.0.0.0:8181');
    assert.equal(config.logLevel, 'debug', '--verbose');
    for (const flag of [
      '--debug',
      '--iam-role-error-ttl',
      '--cache-resync-period',
      '--backoff-max-interval',
      '--log-format',
      '--use-regional-sts-endpoint',
      '--metrics-port',
    ]) {
      assert.ok(
        warnings.some((warning) => warning.startsWith(flag)),
        `${flag} is warned about: ${warnings.join('\n')}`,
      );
    }
  });

  it('accepts the argument list the kube2iam chart renders by default, and with iptables and verbose', () => {
    const chart = [
      '--host-interface=docker0',
      '--node=ip-10-0-1-23.ec2.internal',
      '--iptables=false',
      '--app-port=8181',
      '--metrics-port=8181',
    ];
    const { config, warnings } = resolveConfig(chart, { HOST_IP: '10.0.1.23' });
    assert.deepEqual(
      [config.hostInterface, config.nodeName, config.iptables, config.listen],
      ['docker0', 'ip-10-0-1-23.ec2.internal', false, '0.0.0.0:8181'],
    );
    assert.equal(
      config.metricsListen,
      '0.0.0.0:9181',
      'metrics keep their own port when the chart points them at the app port',
    );
    assert.deepEqual(warnings, [
      '--metrics-port=8181 (kube2iam) is the metadata port, where kube2iam also served /metrics: here /metrics stays on its own listener, 0.0.0.0:9181 (BROKER_METRICS_LISTEN)',
    ]);
    assert.equal(config.hostIp, '10.0.1.23', 'HOST_IP, which the chart sets');
    const withIptables = loadConfig(
      [
        '--host-interface=cali+',
        '--node=n',
        '--host-ip=10.0.1.23',
        '--iptables=true',
        '--verbose',
        '--app-port=8181',
        '--metrics-port=9620',
      ],
      {},
    );
    assert.deepEqual(
      [withIptables.iptables, withIptables.hostIp, withIptables.logLevel, withIptables.metricsListen],
      [true, '10.0.1.23', 'debug', '0.0.0.0:9620'],
    );
  });

  it('translates --iam-role-session-ttl faithfully and names it in errors', () => {
    assert.equal(loadConfig(['--iam-role-session-ttl', '1h'], {}).sessionDurationSeconds, 7200);
    assert.deepEqual(problemsOf(['--iam-role-session-ttl=15m']), [
      '--iam-role-session-ttl=15m, i.e. BROKER_SESSION_DURATION=1800s hands out credentials with as little as 15 min left; SDKs (botocore) refresh from 15 min before expiry and need more than 25 min, so use at least 50m',
    ]);
    assert.deepEqual(problemsOf(['--iam-role-session-ttl', '5m']), [
      '--iam-role-session-ttl=5m (kube2iam\'s flag for BROKER_SESSION_DURATION): expected a duration from 900s to 43200s such as 1h or 45m, got "600s"',
    ]);
    assert.match(
      problemsOf(['--app-port=99999'])[0] as string,
      /^--app-port=99999 \(kube2iam's flag for BROKER_LISTEN\): expected a port from 0 to 65535$/,
    );
  });

  it("takes kube2iam's log levels and restriction formats as kube2iam spells them", () => {
    assert.equal(loadConfig(['--log-level=warning'], {}).logLevel, 'warn');
    assert.equal(loadConfig(['--log-level', 'panic'], {}).logLevel, 'fatal');
    assert.equal(loadConfig(['--namespace-restriction-format=RegExp'], {}).namespaceRestrictionFormat, 'regexp');
    assert.equal(loadConfig(['--verbose=false', '--log-level=error'], {}).logLevel, 'error');
  });
});

describe('kiam agent flags', () => {
  it("accepts them with kiam's meaning, and kiam's proxy default: nothing but credentials", () => {
    const { config, warnings } = resolveConfig(
      [
        '--port=3100',
        '--level=warn',
        '--json-log',
        '--iptables',
        '--host-interface=cali+',
        '--no-iptables-remove',
        '--prometheus-listen-addr=:9620',
      ],
      { HOST_IP: '10.0.1.23' },
    );
    assert.deepEqual(
      [
        config.listen,
        config.logLevel,
        config.iptables,
        config.iptablesRemoveOnExit,
        config.hostIp,
        config.metricsListen,
      ],
      ['0.0.0.0:3100', 'warn', true, false, '10.0.1.23', '0.0.0.0:9620'],
    );
    const allow = new RegExp(config.metadataAllow);
    assert.ok(!allow.test('/latest/meta-data/instance-id'), 'kiam proxies no metadata path by default');
    assert.deepEqual(warnings, ['--json-log (kiam) has no effect: logs are always JSON lines']);
    assert.equal(loadConfig(['--host=10.0.2.2', '--iptables-remove=true'], {}).hostIp, '10.0.2.2');
  });

  it("keeps the agent's own proxy default for everyone else, and an explicit --allow-route-regexp for kiam users", () => {
    assert.ok(new RegExp(loadConfig(['--app-port=8181'], {}).metadataAllow).test('/latest/meta-data/instance-id'));
    assert.ok(
      new RegExp(
        loadConfig(['--port=3100', '--allow-route-regexp=/latest/meta-data/instance-id'], {}).metadataAllow,
      ).test('/latest/meta-data/instance-id'),
    );
  });
});
