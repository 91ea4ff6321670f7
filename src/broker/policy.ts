/**
 * Which role a caller gets, decided from what the lookup found. Pure: the base ARN (configured or
 * discovered) and the options come in as arguments.
 */
import { createHash } from 'node:crypto';
import { z } from 'zod';
import type { PodRecord } from '../cluster/pods.js';
import type { RoleIdentity } from '../model/role-identity.js';
import type { FoundOutcome, LookupOutcome, PodContext, TimeoutOutcome } from './lookup.js';
import { type NamespaceRestrictions, namespaceAllows } from './namespace-restrictions.js';

export interface RolePolicy {
  /** On the pod, else on its ServiceAccount (for both doors), else the default role. */
  readonly roleAnnotation: string;
  readonly externalIdAnnotation: string;
  /** For known pods without a role annotation only: never for a caller no pod owns. */
  readonly defaultRole: string | undefined;
  /** Set: an annotated role must be allowed by the pod's Namespace (the default role always is, annotated or not). */
  readonly namespaceRestrictions?: NamespaceRestrictions;
}

export type Grant =
  | { readonly kind: 'role'; readonly identity: RoleIdentity; readonly source: RoleSource; readonly pod: PodRecord }
  /** A known pod with no role and no default role: 404, final for every SDK. */
  | { readonly kind: 'no-role'; readonly pod: PodRecord; readonly reason: string }
  /** Not decidable yet: a retryable 503. */
  | { readonly kind: 'retry'; readonly pod: PodRecord | undefined; readonly reason: string }
  /** A pod whose annotation cannot be honoured, or whose namespace does not allow its role: 403 with the reason. */
  | { readonly kind: 'denied'; readonly pod: PodRecord; readonly roleArn?: string; readonly reason: string };

/** Where the role came from: the pod's annotation, its ServiceAccount's, or the default role. */
export type RoleSource = 'annotation' | 'service-account' | 'default';

/** Every answer but credentials. */
export type Refusal = Exclude<Grant, { kind: 'role' }>;

const ROLE_ARN = /^arn:aws[a-z-]*:iam::\d{12}:role\/[\w+=,.@/-]{1,512}$/;
const RoleReference = z
  .string()
  .trim()
  .refine((value) => (value.startsWith('arn:') ? ROLE_ARN.test(value) : /^[\w+=,.@-]+(\/[\w+=,.@-]+)*$/.test(value)), {
    message: 'expected a role ARN (arn:aws:iam::123456789012:role/name) or a role name',
  });
const ExternalId = z.string().regex(/^[\w+=,.@:/-]{2,1224}$/, 'expected 2 to 1224 characters of [A-Za-z0-9+=,.@:/-]');

/** A full ARN as is; a bare name (possibly with a path) joined to the base ARN. */
export function roleArnFor(reference: string, baseRoleArn: string | undefined): string | undefined {
  if (reference.startsWith('arn:')) return reference;
  return baseRoleArn === undefined ? undefined : `${baseRoleArn}${reference.replace(/^\/+/, '')}`;
}

/** The name SDKs list and then ask for: the last segment of the ARN (paths are not part of it). */
export function roleNameOf(roleArn: string): string {
  return roleArn.slice(roleArn.lastIndexOf('/') + 1);
}

const SESSION_NAME_MAX = 64;

/**
 * `namespace@pod`, so CloudTrail names the caller. STS allows [\w+=,.@-] and 64 characters; a
 * longer name keeps its start and gets a hash of the whole so that two pods never collide.
 */
export function sessionNameFor(namespace: string, name: string): string {
  const full = `${namespace}@${name}`.replace(/[^\w+=,.@-]/g, '-');
  if (full.length <= SESSION_NAME_MAX) return full;
  const digest = createHash('sha256').update(full).digest('hex').slice(0, 10);
  return `${full.slice(0, SESSION_NAME_MAX - digest.length - 1)}-${digest}`;
}

/** A caller whose pod is not known after its hold is refused: the type says so. */
export function grantFor(
  outcome: TimeoutOutcome,
  ip: string,
  policy: RolePolicy,
  baseRoleArn: string | undefined,
): Refusal;
export function grantFor(
  outcome: FoundOutcome | LookupOutcome,
  ip: string,
  policy: RolePolicy,
  baseRoleArn: string | undefined,
): Grant;
export function grantFor(
  outcome: LookupOutcome,
  ip: string,
  policy: RolePolicy,
  baseRoleArn: string | undefined,
): Grant {
  if (outcome.kind === 'timeout') {
    if (outcome.missing === 'namespace' && outcome.pod) {
      return {
        kind: 'denied',
        pod: outcome.pod,
        reason: `namespace ${outcome.pod.namespace} is not known, so its role restrictions cannot be checked`,
      };
    }
    // Never the default role here: whoever this is, the agent cannot name its pod, so it cannot know the pod has no role of its own.
    const starting =
      outcome.podsAwaitingIp > 0
        ? `; ${outcome.podsAwaitingIp} pod(s) on this node still wait for an IP, the caller may be one of them`
        : '';
    return {
      kind: 'retry',
      pod: undefined,
      reason: `no pod on this node has IP ${ip} after waiting ${outcome.waitedMs} ms${starting}; retry`,
    };
  }
  const { pod } = outcome;
  const annotated = roleAnnotationOf(outcome, policy.roleAnnotation);
  if (annotated.kind === 'unknown')
    return {
      kind: 'retry',
      pod,
      reason: `pod has no ${policy.roleAnnotation} annotation and its ServiceAccount ${pod.serviceAccount} is not known yet (the ServiceAccount informer has not synced); retry`,
    };
  if (annotated.kind === 'none') {
    if (policy.defaultRole === undefined)
      return {
        kind: 'no-role',
        pod,
        reason: `neither the pod nor its ServiceAccount ${pod.serviceAccount} has a ${policy.roleAnnotation} annotation, and no default role is set`,
      };
    return defaultGrant(policy.defaultRole, baseRoleArn, pod);
  }
  const { value, source } = annotated;
  const reference = RoleReference.safeParse(value);
  const where = source === 'service-account' ? `ServiceAccount ${pod.serviceAccount}'s annotation` : 'annotation';
  if (!reference.success)
    return {
      kind: 'denied',
      pod,
      reason: `${where} ${policy.roleAnnotation}="${value}": ${reference.error.issues[0]?.message}`,
    };
  const externalIdText = pod.annotations[policy.externalIdAnnotation];
  const externalId = externalIdText === undefined ? undefined : ExternalId.safeParse(externalIdText.trim());
  if (externalId && !externalId.success)
    return {
      kind: 'denied',
      pod,
      reason: `annotation ${policy.externalIdAnnotation}: ${externalId.error.issues[0]?.message}`,
    };
  const roleArn = roleArnFor(reference.data, baseRoleArn);
  if (roleArn === undefined)
    return {
      kind: 'retry',
      pod,
      reason:
        'the base role ARN is not known yet (set BROKER_BASE_ROLE_ARN, or let the agent discover it from the node)',
    };
  // As in kube2iam, the default role is always allowed, also when a pod names it in its annotation.
  const isDefaultRole = policy.defaultRole !== undefined && roleArnFor(policy.defaultRole, baseRoleArn) === roleArn;
  if (policy.namespaceRestrictions && !isDefaultRole) {
    // lookup waits for the namespace when restrictions are on; a found outcome without one is a wiring mistake, and denies.
    const check = outcome.namespace
      ? namespaceAllows(outcome.namespace, roleArn, policy.namespaceRestrictions, baseRoleArn)
      : {
          allowed: false as const,
          reason: `namespace ${pod.namespace} is not known, so its role restrictions cannot be checked`,
        };
    if (!check.allowed) return { kind: 'denied', pod, roleArn, reason: check.reason };
  }
  return {
    kind: 'role',
    identity: { roleArn, externalId: externalId?.data, sessionName: sessionNameFor(pod.namespace, pod.name) },
    source,
    pod,
  };
}

type AnnotatedRole =
  | { readonly kind: 'found'; readonly value: string; readonly source: Exclude<RoleSource, 'default'> }
  | { readonly kind: 'none' }
  | { readonly kind: 'unknown' };

/** The pod's own annotation wins; a pod without one takes its ServiceAccount's, as IRSA and EKS Pod Identity bind roles to ServiceAccounts. */
function roleAnnotationOf(context: PodContext, key: string): AnnotatedRole {
  const own = context.pod.annotations[key];
  if (own !== undefined && own.trim() !== '') return { kind: 'found', value: own, source: 'annotation' };
  const inherited = context.serviceAccount?.annotations[key];
  if (inherited !== undefined && inherited.trim() !== '')
    return { kind: 'found', value: inherited, source: 'service-account' };
  // Never the default role for a pod whose ServiceAccount may still name another: that would be a wrong role, not a late one.
  return context.serviceAccount === undefined && !context.serviceAccountsSynced
    ? { kind: 'unknown' }
    : { kind: 'none' };
}

function defaultGrant(defaultRole: string, baseRoleArn: string | undefined, pod: PodRecord): Grant {
  const roleArn = roleArnFor(defaultRole, baseRoleArn);
  if (roleArn === undefined)
    return { kind: 'retry', pod, reason: 'the base role ARN for the default role is not known yet' };
  return {
    kind: 'role',
    identity: { roleArn, externalId: undefined, sessionName: sessionNameFor(pod.namespace, pod.name) },
    source: 'default',
    pod,
  };
}
