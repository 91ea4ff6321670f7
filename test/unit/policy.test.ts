import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { LookupOutcome } from '../../src/broker/lookup.js';
import { type RolePolicy, grantFor, roleNameOf, sessionNameFor } from '../../src/broker/policy.js';
import type { PodRecord } from '../../src/cluster/pods.js';
import { podRecord } from '../support/pods.js';

const BASE = 'arn:aws:iam::123456789012:role/';
const policy: RolePolicy = {
  roleAnnotation: 'iam.amazonaws.com/role',
  externalIdAnnotation: 'iam.amazonaws.com/external-id',
  defaultRole: undefined,
};
const found = (pod: PodRecord): LookupOutcome => ({
  kind: 'found',
  pod,
  namespace: undefined,
  serviceAccount: undefined,
  serviceAccountsSynced: true,
  resolvedBy: 'index',
  waitedMs: 0,
});
const timeout = (podsAwaitingIp = 0): LookupOutcome => ({
  kind: 'timeout',
  waitedMs: 300,
  podsAwaitingIp,
  missing: 'pod',
});
const annotated = (annotations: Record<string, string>) =>
  podRecord({ name: 'web', namespace: 'shop', ips: ['10.0.0.5'], annotations });

describe('role policy', () => {
  it('uses a full ARN as is and joins a bare name to the base ARN', () => {
    const full = grantFor(
      found(annotated({ 'iam.amazonaws.com/role': 'arn:aws:iam::999999999999:role/x/reader' })),
      '10.0.0.5',
      policy,
      BASE,
    );
    assert.ok(full.kind === 'role');
    assert.equal(full.identity.roleArn, 'arn:aws:iam::999999999999:role/x/reader');
    const bare = grantFor(found(annotated({ 'iam.amazonaws.com/role': 'reader' })), '10.0.0.5', policy, BASE);
    assert.ok(bare.kind === 'role');
    assert.equal(bare.identity.roleArn, `${BASE}reader`);
    assert.equal(bare.identity.sessionName, 'shop@web');
    assert.equal(bare.source, 'annotation');
  });

  it('passes the external ID annotation and rejects a malformed one', () => {
    const ok = grantFor(
      found(annotated({ 'iam.amazonaws.com/role': 'reader', 'iam.amazonaws.com/external-id': 'ext-42' })),
      '10.0.0.5',
      policy,
      BASE,
    );
    assert.ok(ok.kind === 'role');
    assert.equal(ok.identity.externalId, 'ext-42');
    const bad = grantFor(
      found(annotated({ 'iam.amazonaws.com/role': 'reader', 'iam.amazonaws.com/external-id': 'x' })),
      '10.0.0.5',
      policy,
      BASE,
    );
    assert.equal(bad.kind, 'denied');
  });

  it('denies an annotation that is neither an ARN nor a role name, saying why', () => {
    const grant = grantFor(
      found(annotated({ 'iam.amazonaws.com/role': 'arn:aws:s3:::bucket' })),
      '10.0.0.5',
      policy,
      BASE,
    );
    assert.ok(grant.kind === 'denied');
    assert.match(grant.reason, /expected a role ARN/);
  });

  it('gives no role to an unannotated pod without a default, and the default role with one', () => {
    assert.equal(grantFor(found(annotated({})), '10.0.0.5', policy, BASE).kind, 'no-role');
    const grant = grantFor(found(annotated({})), '10.0.0.5', { ...policy, defaultRole: 'fallback' }, BASE);
    assert.ok(grant.kind === 'role');
    assert.equal(grant.identity.roleArn, `${BASE}fallback`);
    assert.equal(grant.source, 'default');
  });

  it('after the hold: a retryable 503 with the reason, never the default role', () => {
    for (const defaultRole of [undefined, 'fallback']) {
      const alone = grantFor(timeout(), '10.0.0.5', { ...policy, defaultRole }, BASE);
      assert.deepEqual(alone, {
        kind: 'retry',
        pod: undefined,
        reason: 'no pod on this node has IP 10.0.0.5 after waiting 300 ms; retry',
      });
      const withStartingPods = grantFor(timeout(2), '10.0.0.5', { ...policy, defaultRole }, BASE);
      assert.equal(withStartingPods.kind, 'retry');
      assert.match(
        withStartingPods.reason,
        /2 pod\(s\) on this node still wait for an IP, the caller may be one of them/,
      );
    }
  });

  it('answers retry for a bare name while the base ARN is unknown', () => {
    assert.equal(
      grantFor(found(annotated({ 'iam.amazonaws.com/role': 'reader' })), '10.0.0.5', policy, undefined).kind,
      'retry',
    );
  });

  it('makes session names STS accepts, unique even when truncated', () => {
    const long = sessionNameFor('a-very-long-namespace-name-for-testing', 'and-a-very-long-pod-name-7d9f8c6b5-xk2lp');
    assert.ok(long.length <= 64);
    assert.match(long, /^[\w+=,.@-]+$/);
    assert.notEqual(
      long,
      sessionNameFor('a-very-long-namespace-name-for-testing', 'and-a-very-long-pod-name-7d9f8c6b5-xk2lq'),
    );
    assert.equal(sessionNameFor('team', 'fd00::5'), 'team@fd00--5');
  });

  it('lists the last segment of the ARN as the role name', () => {
    assert.equal(roleNameOf('arn:aws:iam::123456789012:role/team/reader'), 'reader');
  });
});

describe("role policy: the ServiceAccount's role annotation", () => {
  const account = (annotations: Record<string, string>) => ({ namespace: 'shop', name: 'default', annotations });
  const withAccount = (
    pod: PodRecord,
    serviceAccount: ReturnType<typeof account> | undefined,
    serviceAccountsSynced = true,
  ): LookupOutcome => ({
    kind: 'found',
    pod,
    namespace: undefined,
    serviceAccount,
    serviceAccountsSynced,
    resolvedBy: 'index',
    waitedMs: 0,
  });
  const withDefault: RolePolicy = { ...policy, defaultRole: 'fallback' };

  it("gives a pod without its own annotation its ServiceAccount's role, before the default role", () => {
    const grant = grantFor(
      withAccount(annotated({}), account({ 'iam.amazonaws.com/role': 'reports' })),
      '10.0.0.5',
      withDefault,
      BASE,
    );
    assert.ok(grant.kind === 'role');
    assert.deepEqual(
      { roleArn: grant.identity.roleArn, source: grant.source, session: grant.identity.sessionName },
      { roleArn: `${BASE}reports`, source: 'service-account', session: 'shop@web' },
    );
  });

  it("lets the pod's own annotation win", () => {
    const grant = grantFor(
      withAccount(annotated({ 'iam.amazonaws.com/role': 'own' }), account({ 'iam.amazonaws.com/role': 'reports' })),
      '10.0.0.5',
      withDefault,
      BASE,
    );
    assert.ok(grant.kind === 'role');
    assert.equal(grant.identity.roleArn, `${BASE}own`);
  });

  it('falls back to the default role, or 404, when the ServiceAccount names no role', () => {
    const defaulted = grantFor(withAccount(annotated({}), account({})), '10.0.0.5', withDefault, BASE);
    assert.ok(defaulted.kind === 'role' && defaulted.source === 'default');
    const none = grantFor(withAccount(annotated({}), undefined), '10.0.0.5', policy, BASE);
    assert.equal(none.kind, 'no-role');
  });

  it('asks for a retry instead of the default role while ServiceAccounts are not synced', () => {
    const grant = grantFor(withAccount(annotated({}), undefined, false), '10.0.0.5', withDefault, BASE);
    assert.equal(grant.kind, 'retry');
    assert.match(grant.kind === 'retry' ? grant.reason : '', /ServiceAccount default is not known yet/);
  });

  it('denies a malformed role on the ServiceAccount, naming where it came from', () => {
    const grant = grantFor(
      withAccount(annotated({}), account({ 'iam.amazonaws.com/role': 'arn:aws:iam::1:role/x' })),
      '10.0.0.5',
      withDefault,
      BASE,
    );
    assert.equal(grant.kind, 'denied');
    assert.match(grant.kind === 'denied' ? grant.reason : '', /ServiceAccount default's annotation/);
  });
});
