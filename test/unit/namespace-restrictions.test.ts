import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { LookupOutcome } from '../../src/broker/lookup.js';
import { type NamespaceRestrictions, namespaceAllows } from '../../src/broker/namespace-restrictions.js';
import { type RolePolicy, grantFor } from '../../src/broker/policy.js';
import { KubeApiError } from '../../src/cluster/kube-connection.js';
import type { NamespaceRecord } from '../../src/cluster/namespaces.js';
import { PodEventRecorder } from '../../src/cluster/pod-events.js';
import { createLogger } from '../../src/log.js';
import { podRecord } from '../support/pods.js';

const BASE = 'arn:aws:iam::123456789012:role/';
const KEY = 'iam.amazonaws.com/allowed-roles';
const PERMITTED = 'iam.amazonaws.com/permitted';
const glob: NamespaceRestrictions = { annotation: KEY, permittedAnnotation: PERMITTED, format: 'glob' };
const regexp: NamespaceRestrictions = { annotation: KEY, permittedAnnotation: PERMITTED, format: 'regexp' };
const namespace = (allowed?: string): NamespaceRecord => ({
  name: 'team-a',
  annotations: allowed === undefined ? {} : { [KEY]: allowed },
});
const allows = (allowed: string | undefined, roleArn: string, restrictions = glob) =>
  namespaceAllows(namespace(allowed), roleArn, restrictions, BASE);

describe('namespace restrictions', () => {
  it('joins a bare-name glob to the base ARN and matches the whole ARN', () => {
    assert.equal(allows('["app-*"]', `${BASE}app-reader`).allowed, true);
    assert.equal(allows('["app-*"]', `${BASE}team/app-reader`).allowed, false, 'anchored at the base ARN');
    assert.equal(allows('["app"]', `${BASE}app-reader`).allowed, false, 'anchored at the end');
    assert.equal(allows('["app-*"]', 'arn:aws:iam::999999999999:role/app-reader').allowed, false, 'another account');
    assert.equal(allows('["arn:aws:iam::*:role/shared"]', 'arn:aws:iam::999999999999:role/shared').allowed, true);
  });

  it('reads glob metacharacters other than * literally', () => {
    assert.equal(allows('["app.reader"]', `${BASE}app.reader`).allowed, true);
    assert.equal(allows('["app.reader"]', `${BASE}appXreader`).allowed, false);
  });

  it('anchors regular expressions, and joins bare ones to the base ARN', () => {
    assert.equal(allows('["app-(reader|writer)"]', `${BASE}app-writer`, regexp).allowed, true);
    assert.equal(allows('["app"]', `${BASE}app-writer`, regexp).allowed, false);
    assert.equal(allows('["arn:aws:iam::\\\\d+:role/x"]', 'arn:aws:iam::123456789012:role/x', regexp).allowed, true);
    assert.equal(
      allows('["reader|.*"]', 'arn:aws:iam::999999999999:role/reader', regexp).allowed,
      false,
      'an alternation stays inside the anchors and the base ARN',
    );
  });

  it('denies with a clear reason for a missing, non-JSON, non-array or bad-regex annotation', () => {
    const reason = (allowed: string | undefined, restrictions = glob) => {
      const check = allows(allowed, `${BASE}app`, restrictions);
      assert.equal(check.allowed, false);
      return check.allowed ? '' : check.reason;
    };
    assert.match(reason(undefined), /sets neither iam.amazonaws.com\/allowed-roles nor iam.amazonaws.com\/permitted/);
    assert.match(reason('app-*'), /not valid JSON/);
    assert.match(reason('{"a":1}'), /JSON array of strings/);
    assert.match(reason('["app", 3]'), /expected string|array of strings/);
    assert.match(reason('["app", "("]', regexp), /invalid regular expression "\("/);
    assert.match(reason('[]'), /is not allowed by/);
  });

  it("reads kiam's permitted annotation: one regular expression over the whole ARN, anchored, beside kube2iam's list", () => {
    const permits = (permitted: string, roleArn: string, allowed?: string) =>
      namespaceAllows(
        {
          name: 'team-a',
          annotations: { [PERMITTED]: permitted, ...(allowed === undefined ? {} : { [KEY]: allowed }) },
        },
        roleArn,
        glob,
        BASE,
      );
    assert.equal(permits('app-.*', `${BASE}app-reader`).allowed, true, 'a bare expression is joined to the base ARN');
    assert.equal(permits('^app-.*$', `${BASE}app-reader`).allowed, true, "kiam users' own anchors are implied");
    assert.equal(permits('app', `${BASE}app-reader`).allowed, false, 'anchored at the end');
    assert.equal(permits('app-.*', 'arn:aws:iam::999999999999:role/app-reader').allowed, false, 'another account');
    assert.equal(permits('arn:aws:iam::999999999999:role/(a|b)', 'arn:aws:iam::999999999999:role/b').allowed, true);
    assert.equal(
      permits('reader|.*', 'arn:aws:iam::999999999999:role/reader').allowed,
      false,
      'an alternation stays inside the anchors',
    );
    const empty = permits('', `${BASE}app`);
    assert.ok(!empty.allowed && /empty and so permits no role/.test(empty.reason), 'empty permits nothing, as in kiam');
    const broken = permits('(', `${BASE}app`, '["app"]');
    assert.ok(
      !broken.allowed && /invalid regular expression/.test(broken.reason),
      'a broken expression denies even when the list allows',
    );
    assert.equal(permits('other', `${BASE}app`, '["app"]').allowed, true, 'either annotation allowing is enough');
    assert.equal(permits('app', `${BASE}app`, '["other"]').allowed, true);
    const neither = permits('other', `${BASE}app`, '["another"]');
    assert.ok(
      !neither.allowed && /allowed-roles .*nor .*permitted/.test(neither.reason),
      neither.allowed ? '' : neither.reason,
    );
  });

  it('allows a pod annotated with the default role in a namespace that lists nothing, as kube2iam does', () => {
    const policy: RolePolicy = {
      roleAnnotation: 'iam.amazonaws.com/role',
      externalIdAnnotation: 'x/e',
      defaultRole: 'fallback',
      namespaceRestrictions: glob,
    };
    const pod = podRecord({
      name: 'web',
      namespace: 'team-a',
      ips: ['10.0.0.5'],
      annotations: { 'iam.amazonaws.com/role': 'fallback' },
    });
    const grant = grantFor(
      {
        kind: 'found',
        pod,
        namespace: namespace(),
        serviceAccount: undefined,
        serviceAccountsSynced: true,
        resolvedBy: 'index',
        waitedMs: 0,
      },
      '10.0.0.5',
      policy,
      BASE,
    );
    assert.ok(grant.kind === 'role', JSON.stringify(grant));
    assert.equal(grant.identity.roleArn, `${BASE}fallback`);
    assert.equal(grant.source, 'annotation');
    const byArn = grantFor(
      {
        kind: 'found',
        pod: { ...pod, annotations: { 'iam.amazonaws.com/role': `${BASE}fallback` } },
        namespace: namespace(),
        serviceAccount: undefined,
        serviceAccountsSynced: true,
        resolvedBy: 'index',
        waitedMs: 0,
      },
      '10.0.0.5',
      policy,
      BASE,
    );
    assert.equal(byArn.kind, 'role', 'named by its full ARN too');
    const withoutDefault = grantFor(
      {
        kind: 'found',
        pod,
        namespace: namespace(),
        serviceAccount: undefined,
        serviceAccountsSynced: true,
        resolvedBy: 'index',
        waitedMs: 0,
      },
      '10.0.0.5',
      { ...policy, defaultRole: undefined },
      BASE,
    );
    assert.equal(withoutDefault.kind, 'denied', 'only while it is the default role');
  });

  it('is applied by the role policy to annotated roles only; the default role is always allowed', () => {
    const policy: RolePolicy = {
      roleAnnotation: 'iam.amazonaws.com/role',
      externalIdAnnotation: 'x/e',
      defaultRole: 'fallback',
      namespaceRestrictions: glob,
    };
    const found = (annotations: Record<string, string>, ns: NamespaceRecord | undefined): LookupOutcome => ({
      kind: 'found',
      pod: podRecord({ name: 'web', namespace: 'team-a', ips: ['10.0.0.5'], annotations }),
      namespace: ns,
      serviceAccount: undefined,
      serviceAccountsSynced: true,
      resolvedBy: 'index',
      waitedMs: 0,
    });
    const allowed = grantFor(
      found({ 'iam.amazonaws.com/role': 'app-reader' }, namespace('["app-*"]')),
      '10.0.0.5',
      policy,
      BASE,
    );
    assert.equal(allowed.kind, 'role');
    const denied = grantFor(
      found({ 'iam.amazonaws.com/role': 'admin' }, namespace('["app-*"]')),
      '10.0.0.5',
      policy,
      BASE,
    );
    assert.ok(denied.kind === 'denied');
    assert.equal(denied.roleArn, `${BASE}admin`);
    assert.match(denied.reason, /is not allowed by namespace team-a/);
    const defaulted = grantFor(found({}, namespace()), '10.0.0.5', policy, BASE);
    assert.ok(defaulted.kind === 'role' && defaulted.source === 'default');
    const unknownNamespace = grantFor(
      {
        kind: 'timeout',
        waitedMs: 300,
        podsAwaitingIp: 0,
        missing: 'namespace',
        pod: podRecord({ name: 'web', namespace: 'team-a' }),
      },
      '10.0.0.5',
      policy,
      BASE,
    );
    assert.ok(unknownNamespace.kind === 'denied');
    assert.match(unknownNamespace.reason, /namespace team-a is not known/);
  });
});

describe('RoleDenied Events', () => {
  const target = { namespace: 'team-a', name: 'web', uid: 'uid-web' };

  it('posts one Warning Event on the pod per reason within the repeat window', async () => {
    const posted: Array<{ namespace: string; body: Record<string, unknown> }> = [];
    let now = 0;
    const recorder = new PodEventRecorder({
      createEvent: async (ns, body) => posted.push({ namespace: ns, body: body as unknown as Record<string, unknown> }),
      logger: createLogger('silent'),
      host: 'node-a',
      now: () => now,
    });
    recorder.warn(target, 'RoleDenied', 'role x is not allowed');
    recorder.warn(target, 'RoleDenied', 'role x is not allowed');
    now = 61_000;
    recorder.warn(target, 'RoleDenied', 'role x is not allowed');
    assert.equal(posted.length, 2);
    assert.equal(posted[0]?.namespace, 'team-a');
    assert.deepEqual(posted[0]?.body.involvedObject, {
      apiVersion: 'v1',
      kind: 'Pod',
      namespace: 'team-a',
      name: 'web',
      uid: 'uid-web',
    });
    assert.equal(posted[0]?.body.type, 'Warning');
  });

  it('logs a 403 from the API once at warn and never throws', async () => {
    const lines: string[] = [];
    const logger = createLogger('debug', { write: (line: string) => void lines.push(line) });
    const recorder = new PodEventRecorder({
      createEvent: () => Promise.reject(new KubeApiError(403, 'events is forbidden')),
      logger,
      host: undefined,
    });
    for (const reason of ['a', 'b', 'c']) recorder.warn(target, 'RoleDenied', reason);
    await new Promise((resolve) => setImmediate(resolve));
    const warnings = lines.map((line) => JSON.parse(line)).filter((line) => line.level === 40);
    assert.equal(warnings.length, 1);
    assert.match(warnings[0].msg, /not allowed to create Events/);
  });
});
