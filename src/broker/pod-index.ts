/**
 * What the agent knows of the cluster: which pod owns each IP, the namespaces, and whether the
 * informers are in sync. PodIndex is a deterministic reducer over informer events (no I/O, no
 * clock); LivePodIndex feeds it from the informers and tells waiting lookups when a key changes.
 */
import { Observable, Subject, type Subscriber, type Subscription } from 'rxjs';
import type { InformerEvent } from '../cluster/informer.js';
import type { NamespaceRecord } from '../cluster/namespaces.js';
import type { PodRecord } from '../cluster/pods.js';
import type { ServiceAccountRecord } from '../cluster/service-accounts.js';

export type IndexEvent =
  | { readonly resource: 'pods'; readonly event: InformerEvent<PodRecord> }
  | { readonly resource: 'namespaces'; readonly event: InformerEvent<NamespaceRecord> }
  | { readonly resource: 'serviceaccounts'; readonly event: InformerEvent<ServiceAccountRecord> };

export type IndexKey = `ip:${string}` | `ns:${string}`;
export const ipKey = (ip: string): IndexKey => `ip:${ip}`;
export const namespaceKey = (name: string): IndexKey => `ns:${name}`;

/** What an applied event changed: lookups waiting on these keys re-evaluate. */
export interface IndexChange {
  readonly keys: readonly IndexKey[];
  /** IPs whose owning pod is now a different pod (or none). */
  readonly ownerChanges: ReadonlyArray<{
    readonly ip: string;
    readonly before?: PodRecord;
    readonly after?: PodRecord;
  }>;
}

export interface AppliedEvent {
  readonly event: IndexEvent;
  readonly change: IndexChange;
}

export interface InformerHealth {
  /** A full list has completed at least once. */
  readonly synced: boolean;
  /** The watch stream is open; false while the API server is unreachable. */
  readonly watching: boolean;
  readonly lastError?: string;
}

/** The read side of the index, all the pure lookup decision needs. */
export interface IndexView {
  ownerOf(ip: string): PodRecord | undefined;
  namespace(name: string): NamespaceRecord | undefined;
  /** A pod by uid, as a verified service-account token names it. */
  pod(uid: string): PodRecord | undefined;
  serviceAccount(namespace: string, name: string): ServiceAccountRecord | undefined;
  /** Live pods that have no IP yet and do not share the node's network: callers that may not be indexed yet. */
  podsAwaitingIp(): number;
  health(resource: IndexEvent['resource']): InformerHealth;
}

/**
 * Why the agent cannot vouch for what it knows of these resources, or undefined when it can. A
 * failed watch (noticed within BROKER_WATCH_DEADLINE of its death) leaves the index as it was,
 * and a pod deleted meanwhile may have handed its IP to another pod: answering from it could give
 * the new pod the old one's role. Vouched for again once the informer watches again (it relists
 * or replays what it missed first). Before the first list nothing is known, so nothing is doubted.
 */
export function indexDoubt(view: IndexView, resources: ReadonlyArray<IndexEvent['resource']>): string | undefined {
  for (const resource of resources) {
    const health = view.health(resource);
    if (!health.watching && health.lastError !== undefined) {
      return `the agent cannot vouch for its ${resource} index while the API server is unreachable (${health.lastError}); retry`;
    }
  }
  return undefined;
}

const TERMINAL_PHASES = new Set(['Succeeded', 'Failed']);

/** A pod holds its IPs for lookups only while it is live and has its own network namespace. */
export const claimsIps = (pod: PodRecord): boolean =>
  !pod.hostNetwork && pod.ips.length > 0 && !TERMINAL_PHASES.has(pod.phase);

interface Claim {
  readonly pod: PodRecord;
  /** Order in which the claim was first seen, to break ties between pods created in the same second. */
  readonly seen: number;
}

export class PodIndex implements IndexView {
  private readonly pods = new Map<string, PodRecord>();
  private readonly uidByName = new Map<string, string>();
  private readonly claims = new Map<string, Map<string, Claim>>();
  private readonly awaitingIp = new Set<string>();
  private readonly namespaces = new Map<string, NamespaceRecord>();
  private readonly serviceAccounts = new Map<string, ServiceAccountRecord>();
  private readonly informers = new Map<IndexEvent['resource'], InformerHealth>();
  private claimsSeen = 0;

  /** @param nodeName the agent's node: only pods scheduled there can be callers awaiting an IP. */
  constructor(private readonly nodeName?: string) {}

  private awaitsIp(pod: PodRecord): boolean {
    const onThisNode = this.nodeName === undefined ? pod.nodeName !== undefined : pod.nodeName === this.nodeName;
    return onThisNode && !pod.hostNetwork && pod.ips.length === 0 && !TERMINAL_PHASES.has(pod.phase);
  }

  apply(indexEvent: IndexEvent): IndexChange {
    const { event } = indexEvent;
    switch (event.type) {
      case 'upsert':
      case 'delete':
        switch (indexEvent.resource) {
          case 'pods':
            return this.applyPod(event.type, event.object as PodRecord);
          case 'namespaces':
            return this.applyNamespace(event.type, event.object);
          case 'serviceaccounts':
            return this.applyServiceAccount(event.type, event.object as ServiceAccountRecord);
        }
        return NO_CHANGE;
      case 'synced':
        this.setHealth(indexEvent.resource, { synced: true, watching: this.health(indexEvent.resource).watching });
        return NO_CHANGE;
      case 'watching':
        this.setHealth(indexEvent.resource, { synced: this.health(indexEvent.resource).synced, watching: true });
        return NO_CHANGE;
      case 'disconnected':
        this.setHealth(indexEvent.resource, {
          synced: this.health(indexEvent.resource).synced,
          watching: false,
          lastError: event.error,
        });
        return NO_CHANGE;
      case 'invalid':
        return NO_CHANGE;
    }
  }

  ownerOf(ip: string): PodRecord | undefined {
    let best: Claim | undefined;
    for (const claim of this.claims.get(ip)?.values() ?? []) {
      if (!best || isNewer(claim, best)) best = claim;
    }
    return best?.pod;
  }

  namespace(name: string): NamespaceRecord | undefined {
    return this.namespaces.get(name);
  }

  pod(uid: string): PodRecord | undefined {
    return this.pods.get(uid);
  }

  serviceAccount(namespace: string, name: string): ServiceAccountRecord | undefined {
    return this.serviceAccounts.get(`${namespace}/${name}`);
  }

  podsAwaitingIp(): number {
    return this.awaitingIp.size;
  }

  health(resource: IndexEvent['resource']): InformerHealth {
    return this.informers.get(resource) ?? { synced: false, watching: false };
  }

  podCount(): number {
    return this.pods.size;
  }

  /** Every IP and its owner, for the debug endpoint. */
  *owners(): IterableIterator<[string, PodRecord]> {
    for (const ip of this.claims.keys()) {
      const owner = this.ownerOf(ip);
      if (owner) yield [ip, owner];
    }
  }

  private applyPod(type: 'upsert' | 'delete', pod: PodRecord): IndexChange {
    const touchedIps = new Set<string>(pod.ips);
    const before = new Map<string, PodRecord | undefined>();
    const remember = (ips: readonly string[]) => {
      for (const ip of ips) {
        touchedIps.add(ip);
        if (!before.has(ip)) before.set(ip, this.ownerOf(ip));
      }
    };
    remember(pod.ips);
    const nameKey = `${pod.namespace}/${pod.name}`;
    // A relist reports a pod recreated under the same name as an update: the old uid is gone.
    const previousUidForName = this.uidByName.get(nameKey);
    if (type === 'upsert' && previousUidForName !== undefined && previousUidForName !== pod.uid) {
      remember(this.pods.get(previousUidForName)?.ips ?? []);
      this.removePod(previousUidForName);
    }
    remember(this.pods.get(pod.uid)?.ips ?? []);
    if (type === 'delete') {
      // Only this uid's claims go: a newer pod that reuses the IP keeps it.
      this.removePod(pod.uid);
    } else {
      this.storePod(pod);
    }
    const ownerChanges = [...before].flatMap(([ip, previousOwner]) => {
      const owner = this.ownerOf(ip);
      return owner?.uid === previousOwner?.uid ? [] : [{ ip, before: previousOwner, after: owner }];
    });
    return { keys: [...touchedIps].map(ipKey), ownerChanges };
  }

  private storePod(pod: PodRecord): void {
    const previous = this.pods.get(pod.uid);
    const previouslySeen = new Map<string, number>();
    for (const ip of previous?.ips ?? []) {
      const seen = this.claims.get(ip)?.get(pod.uid)?.seen;
      if (seen !== undefined) previouslySeen.set(ip, seen);
    }
    this.removePod(pod.uid);
    this.pods.set(pod.uid, pod);
    this.uidByName.set(`${pod.namespace}/${pod.name}`, pod.uid);
    if (this.awaitsIp(pod)) this.awaitingIp.add(pod.uid);
    if (!claimsIps(pod)) return;
    for (const ip of pod.ips) {
      let holders = this.claims.get(ip);
      if (!holders) this.claims.set(ip, (holders = new Map<string, Claim>()));
      holders.set(pod.uid, { pod, seen: previouslySeen.get(ip) ?? ++this.claimsSeen });
    }
  }

  private removePod(uid: string): void {
    const pod = this.pods.get(uid);
    if (!pod) return;
    this.pods.delete(uid);
    this.awaitingIp.delete(uid);
    const nameKey = `${pod.namespace}/${pod.name}`;
    if (this.uidByName.get(nameKey) === uid) this.uidByName.delete(nameKey);
    for (const ip of pod.ips) {
      const holders = this.claims.get(ip);
      holders?.delete(uid);
      if (holders?.size === 0) this.claims.delete(ip);
    }
  }

  private applyNamespace(type: 'upsert' | 'delete', namespace: NamespaceRecord): IndexChange {
    if (type === 'delete') this.namespaces.delete(namespace.name);
    else this.namespaces.set(namespace.name, namespace);
    return { keys: [namespaceKey(namespace.name)], ownerChanges: [] };
  }

  /** No key changes: a lookup never waits for a ServiceAccount, the policy reads it when it decides. */
  private applyServiceAccount(type: 'upsert' | 'delete', account: ServiceAccountRecord): IndexChange {
    const key = `${account.namespace}/${account.name}`;
    if (type === 'delete') this.serviceAccounts.delete(key);
    else this.serviceAccounts.set(key, account);
    return NO_CHANGE;
  }

  private setHealth(resource: IndexEvent['resource'], health: InformerHealth): void {
    this.informers.set(resource, health);
  }
}

const NO_CHANGE: IndexChange = { keys: [], ownerChanges: [] };

/** The most recently created pod wins an IP: the CNI only hands an IP to a new pod once the old one's sandbox is gone. */
function isNewer(a: Claim, b: Claim): boolean {
  return a.pod.createdAtMs !== b.pod.createdAtMs ? a.pod.createdAtMs > b.pod.createdAtMs : a.seen > b.seen;
}

/**
 * The index fed by the informers, with a notification per key so that a waiting lookup hears
 * only about its own IP (or namespace): one event wakes exactly the lookups it can resolve.
 */
export class LivePodIndex {
  readonly view: PodIndex;
  private readonly watchers = new Map<IndexKey, Set<Subscriber<void>>>();
  private readonly appliedSubject = new Subject<AppliedEvent>();
  /** Every applied event with what it changed (audit of pods indexed and removed, prefetch). */
  readonly applied$: Observable<AppliedEvent> = this.appliedSubject.asObservable();

  constructor(nodeName?: string) {
    this.view = new PodIndex(nodeName);
  }

  /** Applies every event from the source until the returned subscription ends. */
  connect(events: Observable<IndexEvent>): Subscription {
    return events.subscribe((event) => this.apply(event));
  }

  apply(event: IndexEvent): IndexChange {
    const change = this.view.apply(event);
    this.appliedSubject.next({ event, change });
    for (const key of change.keys) {
      for (const watcher of [...(this.watchers.get(key) ?? [])]) watcher.next();
    }
    return change;
  }

  /** Emits (synchronously, inside the informer's event) each time one of the keys changes. */
  changes(keys: readonly IndexKey[]): Observable<void> {
    return new Observable<void>((subscriber) => {
      for (const key of keys) {
        let set = this.watchers.get(key);
        if (!set) this.watchers.set(key, (set = new Set()));
        set.add(subscriber);
      }
      return () => {
        for (const key of keys) {
          const set = this.watchers.get(key);
          set?.delete(subscriber);
          if (set?.size === 0) this.watchers.delete(key);
        }
      };
    });
  }

  /** Number of keys with waiting lookups, for metrics and for tests that no waiter outlives its request. */
  waitingKeys(): number {
    return this.watchers.size;
  }
}
