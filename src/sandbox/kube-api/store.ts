/**
 * The cluster's state: objects per resource, one resourceVersion counter for all of them, and the
 * history of changes that watches replay. Stored objects are never mutated in place, so history and
 * watches can share them.
 */
import { randomUUID } from 'node:crypto';
import { type ObjectInput, type ObjectMeta, type StoredObject, nowIso, withResourceVersion } from './objects.js';

/** What the store needs to know of a resource to keep its objects. */
export interface StoredResource {
  readonly name: string;
  readonly kind: string;
  readonly namespaced: boolean;
}

export type ChangeType = 'ADDED' | 'MODIFIED' | 'DELETED';

/** One committed state change, kept so that watches can replay it. */
export interface Change {
  readonly resource: string;
  readonly type: ChangeType;
  readonly rv: number;
  readonly object: StoredObject;
  /** State before a MODIFIED change: decides ADDED/DELETED for selector watches. */
  readonly previous?: StoredObject;
}

/** Replayable history length; older resourceVersions become "too old" like after an etcd compaction. */
const MAX_HISTORY = 10_000;

export class ObjectStore {
  private readonly objects = new Map<string, Map<string, StoredObject>>();
  private readonly changes: Change[] = [];
  private readonly listeners = new Set<(change: Change) => void>();
  /** Starts above 0 because "0" means "any version" in the protocol; a list must never return it. */
  private rv = 1;
  private expired = 0;

  /** The latest resourceVersion handed out. */
  get resourceVersion(): number {
    return this.rv;
  }

  /** Watches starting at or below this resourceVersion get 410 Expired. */
  get expiredThrough(): number {
    return this.expired;
  }

  get history(): readonly Change[] {
    return this.changes;
  }

  /** For resources that take a resourceVersion without being stored (events). */
  nextResourceVersion(): number {
    return ++this.rv;
  }

  onChange(listener: (change: Change) => void): void {
    this.listeners.add(listener);
  }

  get(resource: StoredResource, key: string): StoredObject | undefined {
    return this.byResource(resource).get(key);
  }

  /** Every object of the resource, in key order (namespace/name), as the API server lists them. */
  list(resource: StoredResource): StoredObject[] {
    return [...this.byResource(resource).entries()].sort(([a], [b]) => a.localeCompare(b)).map(([, object]) => object);
  }

  put(resource: StoredResource, input: ObjectInput): StoredObject {
    const key = objectKey(resource, input.metadata);
    const previous = this.byResource(resource).get(key);
    const rv = ++this.rv;
    const copy = structuredClone(input);
    const object: StoredObject = {
      ...copy,
      apiVersion: 'v1',
      kind: resource.kind,
      metadata: {
        ...copy.metadata,
        uid: copy.metadata.uid ?? previous?.metadata.uid ?? randomUUID(),
        creationTimestamp: copy.metadata.creationTimestamp ?? previous?.metadata.creationTimestamp ?? nowIso(),
        resourceVersion: String(rv),
      },
    };
    this.byResource(resource).set(key, object);
    this.commit({ resource: resource.name, type: previous ? 'MODIFIED' : 'ADDED', rv, object, previous });
    return structuredClone(object);
  }

  remove(resource: StoredResource, key: string): StoredObject | undefined {
    const last = this.byResource(resource).get(key);
    if (!last) return undefined;
    this.byResource(resource).delete(key);
    const rv = ++this.rv;
    const object = withResourceVersion(last, rv);
    this.commit({ resource: resource.name, type: 'DELETED', rv, object });
    return structuredClone(object);
  }

  /** Forgets the history, as an etcd compaction does: no resourceVersion so far can be watched from. */
  compact(): void {
    this.expired = this.rv;
    this.changes.length = 0;
    // Advance past the compaction point so a relist gets a resourceVersion that can be watched,
    // otherwise clients would loop between list and "too old".
    this.rv += 1;
  }

  private commit(change: Change): void {
    this.changes.push(change);
    if (this.changes.length > MAX_HISTORY) {
      const evicted = this.changes.shift() as Change;
      this.expired = Math.max(this.expired, evicted.rv - 1);
    }
    for (const listener of this.listeners) listener(change);
  }

  private byResource(resource: StoredResource): Map<string, StoredObject> {
    let objects = this.objects.get(resource.name);
    if (!objects) this.objects.set(resource.name, (objects = new Map<string, StoredObject>()));
    return objects;
  }
}

export function objectKey(resource: StoredResource, metadata: ObjectMeta): string {
  return resource.namespaced ? `${metadata.namespace}/${metadata.name}` : metadata.name;
}
