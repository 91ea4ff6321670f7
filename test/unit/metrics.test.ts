/** The metrics derived from the audit stream: the node's DNAT rule and conntrack drops, and denials by bounded reason. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Subject } from 'rxjs';
import { BrokerMetrics } from '../../src/admin/metrics.js';
import { AuditStream } from '../../src/audit/events.js';
import type { AppliedEvent } from '../../src/broker/pod-index.js';
import { PodIndex } from '../../src/broker/pod-index.js';

function metricsOver(audit: AuditStream): BrokerMetrics {
  return new BrokerMetrics({
    events$: audit.events$,
    applied$: new Subject<AppliedEvent>(),
    index: new PodIndex('node-a'),
    waitingLookups: () => 0,
    cacheSize: () => 0,
    queuedStsCalls: () => 0,
  });
}

const sample = async (metrics: BrokerMetrics, series: string): Promise<number | undefined> => {
  const line = (await metrics.registry.metrics()).split('\n').find((candidate) => candidate.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
};

describe('metrics from the audit stream', () => {
  it('follow the DNAT rule through install, re-installs and removal, and count conntrack drops', async () => {
    const audit = new AuditStream();
    const metrics = metricsOver(audit);
    assert.equal(await sample(metrics, 'kube_iam_broker_dnat_rule_present'), 0);
    audit.publish({ type: 'node.iptables', action: 'installed', detail: 'rule' });
    audit.publish({ type: 'node.conntrack', action: 'dropped', count: 3, detail: 'stale' });
    assert.equal(await sample(metrics, 'kube_iam_broker_dnat_rule_present'), 1);
    audit.publish({ type: 'node.iptables', action: 'reinstalled', detail: 'rule' });
    audit.publish({ type: 'node.iptables', action: 'reinstalled', detail: 'rule' });
    audit.publish({ type: 'node.conntrack', action: 'dropped', count: 2, detail: 'stale' });
    assert.equal(await sample(metrics, 'kube_iam_broker_dnat_rule_reinstalls_total'), 2);
    assert.equal(await sample(metrics, 'kube_iam_broker_conntrack_entries_dropped_total'), 5);
    audit.publish({ type: 'node.iptables', action: 'removed', detail: 'rule' });
    assert.equal(await sample(metrics, 'kube_iam_broker_dnat_rule_present'), 0);
    metrics.stop();
  });

  it('label denials by their bounded cause, never by the free-text reason', async () => {
    const audit = new AuditStream();
    const metrics = metricsOver(audit);
    audit.publish({
      type: 'credential.denied',
      podIp: '10.0.0.9',
      status: 503,
      cause: 'unknown-pod',
      reason: 'no pod with IP 10.0.0.9 appeared within the grace window',
      waitedMs: 300,
    });
    audit.publish({
      type: 'credential.denied',
      podIp: '10.0.0.7',
      status: 503,
      cause: 'sts-failed',
      reason: 'could not get credentials for arn:aws:iam::123456789012:role/x: throttled',
      waitedMs: 0,
    });
    audit.publish({
      type: 'credential.denied',
      podIp: '10.0.0.7',
      status: 503,
      cause: 'sts-failed',
      reason: 'another text',
      waitedMs: 0,
    });
    assert.equal(
      await sample(metrics, 'kube_iam_broker_credentials_denied_total{status="503",reason="unknown-pod"}'),
      1,
    );
    assert.equal(
      await sample(metrics, 'kube_iam_broker_credentials_denied_total{status="503",reason="sts-failed"}'),
      2,
    );
    assert.doesNotMatch(
      await metrics.registry.metrics(),
      /10\.0\.0\.|arn:aws|grace window/,
      'no IP, role or free text in any label',
    );
    metrics.stop();
  });
});
