/**
 * Prefetch: as soon as the index gives an IP to a pod with a role, that pod's identity is
 * tracked by the cache (fetched in the background, then kept refreshed), so its first request is
 * a cache hit. When the IP loses its pod, or the pod's role changes, the old identity is released.
 * The identity comes from the same policy as requests (grantFor), never from a second reading of
 * the annotations.
 */
import type { Observable, Subscription } from 'rxjs';
import { podContext } from '../broker/lookup.js';
import type { AppliedEvent, IndexView } from '../broker/pod-index.js';
import { type RolePolicy, grantFor } from '../broker/policy.js';
import { type RoleIdentity, identityKey } from '../model/role-identity.js';

export interface IdentityTracker {
  track(identity: RoleIdentity): void;
  untrack(identity: RoleIdentity): void;
}

export interface PrefetchOptions {
  readonly applied$: Observable<AppliedEvent>;
  readonly view: IndexView;
  readonly policy: RolePolicy;
  readonly baseRoleArn: () => string | undefined;
  readonly cache: IdentityTracker;
}

/** The identity the owner of an IP would get now, if it gets a role at all. */
export function identityOf(
  view: IndexView,
  ip: string,
  policy: RolePolicy,
  baseRoleArn: string | undefined,
): RoleIdentity | undefined {
  const pod = view.ownerOf(ip);
  if (!pod) return undefined;
  const grant = grantFor(
    { kind: 'found', ...podContext(view, pod), resolvedBy: 'index', waitedMs: 0 },
    ip,
    policy,
    baseRoleArn,
  );
  return grant.kind === 'role' ? grant.identity : undefined;
}

/** The IPs whose identity may have changed with this event: owner changes, and the IPs of an upserted or deleted pod (its role may have changed). */
export function touchedIps({ event, change }: AppliedEvent): string[] {
  const ips = new Set(change.ownerChanges.map((owner) => owner.ip));
  if (event.resource === 'pods' && (event.event.type === 'upsert' || event.event.type === 'delete')) {
    for (const ip of event.event.object.ips) ips.add(ip);
  }
  return [...ips];
}

export interface Reconciliation {
  readonly track: RoleIdentity[];
  readonly untrack: RoleIdentity[];
}

/** Updates `byIp` (what each IP's identity was) to `now`, and says what to track and release. Pure but for `byIp`. */
export function reconcile(
  byIp: Map<string, RoleIdentity>,
  now: ReadonlyArray<readonly [string, RoleIdentity | undefined]>,
): Reconciliation {
  const result: Reconciliation = { track: [], untrack: [] };
  for (const [ip, identity] of now) {
    const before = byIp.get(ip);
    if (before && identity && identityKey(before) === identityKey(identity)) continue;
    if (before) result.untrack.push(before);
    if (identity) {
      result.track.push(identity);
      byIp.set(ip, identity);
    } else {
      byIp.delete(ip);
    }
  }
  return result;
}

export function prefetchCredentials(options: PrefetchOptions): Subscription {
  const byIp = new Map<string, RoleIdentity>();
  return options.applied$.subscribe((applied) => {
    const ips = touchedIps(applied);
    if (ips.length === 0) return;
    const baseRoleArn = options.baseRoleArn();
    const { track, untrack } = reconcile(
      byIp,
      ips.map((ip) => [ip, identityOf(options.view, ip, options.policy, baseRoleArn)] as const),
    );
    // Track first, so an identity that only moved between IPs of one pod is never dropped.
    for (const identity of track) options.cache.track(identity);
    for (const identity of untrack) options.cache.untrack(identity);
  });
}
