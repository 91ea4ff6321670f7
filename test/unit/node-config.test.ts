import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ConfigError, loadConfig } from '../../src/config/load.js';
import { TaintText, formatTaint } from '../../src/node/taint.js';

describe('node integration options', () => {
  it('are off or safe by default: no rule; when one is on, drop connections and keep the rules at exit (fail closed); no taint', () => {
    const config = loadConfig([], {});
    assert.equal(config.iptables, false);
    assert.equal(config.iptablesBinary, 'auto');
    assert.equal(config.iptablesCheckIntervalSeconds, 10);
    assert.equal(config.iptablesRemoveOnExit, false);
    assert.equal(config.dropConnections, true);
    assert.equal(config.nodeTaint, undefined);
  });

  it("accept kube2iam's --iptables, --host-ip, --host-interface and kiam's --iptables-remove", () => {
    const config = loadConfig(
      ['--iptables', '--host-ip', '10.0.0.7', '--host-interface', '!eth0', '--iptables-remove=true'],
      {},
    );
    assert.equal(config.iptables, true);
    assert.equal(config.hostIp, '10.0.0.7');
    assert.equal(config.hostInterface, '!eth0');
    assert.equal(config.iptablesRemoveOnExit, true);
  });

  it('reject an interface pattern iptables would not accept and a host IP that is not IPv4', () => {
    assert.throws(() => loadConfig([], { BROKER_HOST_INTERFACE: 'cali+; rm -rf /' }), ConfigError);
    assert.throws(() => loadConfig([], { BROKER_HOST_INTERFACE: 'a-very-long-interface-name' }), ConfigError);
    assert.throws(() => loadConfig([], { BROKER_HOST_IP: 'node-a' }), ConfigError);
  });

  it('parse a taint as kubectl writes it, key[=value]:effect', () => {
    assert.deepEqual(TaintText.parse('kube-iam-broker/not-ready:NoSchedule'), {
      key: 'kube-iam-broker/not-ready',
      effect: 'NoSchedule',
    });
    assert.deepEqual(TaintText.parse('example.com/agent=starting:NoExecute'), {
      key: 'example.com/agent',
      value: 'starting',
      effect: 'NoExecute',
    });
    assert.equal(
      formatTaint(TaintText.parse('example.com/agent=starting:NoExecute')),
      'example.com/agent=starting:NoExecute',
    );
    assert.equal(loadConfig([], { BROKER_NODE_TAINT: 'ready:PreferNoSchedule' }).nodeTaint?.effect, 'PreferNoSchedule');
  });

  it('reject taints with an unknown effect, a bad key or no effect, naming the problem', () => {
    for (const text of [
      'kube-iam-broker/not-ready:NoRun',
      'Bad_Prefix/x:NoSchedule',
      'kube-iam-broker/not-ready',
      '=v:NoSchedule',
    ]) {
      assert.throws(
        () => loadConfig([], { BROKER_NODE_TAINT: text }),
        (error: unknown) => error instanceof ConfigError && /BROKER_NODE_TAINT/.test(error.message),
        text,
      );
    }
  });
});
