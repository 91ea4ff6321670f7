/**
 * Every resource the fake API server serves, and what each verb does. A resource added to RESOURCES
 * gets its routes and its discovery entry from here alone: stored resources are served by the common
 * get, list, watch and patch handlers; the others bring their own create handler.
 */
import { randomUUID } from 'node:crypto';
import type { DiscoveredResource } from './discovery.js';
import { applyPatch } from './json-patch.js';
import { isPlainObject, nowIso, type StoredObject } from './objects.js';
import { type Reply, type RequestContext, type Route, escapeRegExp } from './routing.js';
import { objectPredicate } from './selectors.js';
import { ApiError } from './status.js';
import type { ServiceAccountTokens } from './service-account-tokens.js';
import { type ObjectStore, type StoredResource, objectKey } from './store.js';
import { isWatchRequest, type Watches } from './watch.js';

/** What the handlers act on. */
export interface Cluster {
  readonly store: ObjectStore;
  readonly watches: Watches;
  readonly tokens: ServiceAccountTokens;
  recordEvent(event: unknown): void;
}

interface StoredApiResource extends DiscoveredResource, StoredResource {
  readonly stored: true;
  /** Rejects (with an ApiError) an object that a patch has made invalid. */
  readonly validate?: (object: StoredObject) => void;
}

interface ActionApiResource extends DiscoveredResource {
  readonly stored: false;
  /** `namespace` is undefined for a cluster-scoped resource. */
  readonly create: (ctx: RequestContext, namespace: string | undefined, cluster: Cluster) => Reply;
}

type ApiResource = StoredApiResource | ActionApiResource;

const READ = ['get', 'list', 'watch'];

export const PODS: StoredApiResource = {
  groupVersion: 'v1',
  name: 'pods',
  kind: 'Pod',
  namespaced: true,
  shortName: 'po',
  verbs: READ,
  stored: true,
};

export const NAMESPACES: StoredApiResource = {
  groupVersion: 'v1',
  name: 'namespaces',
  kind: 'Namespace',
  namespaced: false,
  shortName: 'ns',
  verbs: READ,
  stored: true,
};

export const NODES: StoredApiResource = {
  groupVersion: 'v1',
  name: 'nodes',
  kind: 'Node',
  namespaced: false,
  shortName: 'no',
  verbs: [...READ, 'patch'],
  stored: true,
  validate: (node) => {
    const taints = isPlainObject(node.spec) ? node.spec.taints : undefined;
    if (taints === undefined) return;
    const valid =
      Array.isArray(taints) &&
      taints.every((t) => isPlainObject(t) && typeof t.key === 'string' && typeof t.effect === 'string');
    if (!valid) throw new ApiError(422, 'spec.taints must be a list of {key, effect} objects');
  },
};

export const SERVICE_ACCOUNTS: StoredApiResource = {
  groupVersion: 'v1',
  name: 'serviceaccounts',
  kind: 'ServiceAccount',
  namespaced: true,
  shortName: 'sa',
  verbs: READ,
  stored: true,
};

const TOKEN_REVIEWS: ActionApiResource = {
  groupVersion: 'authentication.k8s.io/v1',
  name: 'tokenreviews',
  kind: 'TokenReview',
  namespaced: false,
  verbs: ['create'],
  stored: false,
  create: (ctx, _namespace, cluster) => ({
    status: 201,
    body: cluster.tokens.review(
      ctx.body,
      (namespace, name) => cluster.store.get(PODS, `${namespace}/${name}`)?.metadata,
    ),
  }),
};

const events = (groupVersion: string): ActionApiResource => ({
  groupVersion,
  name: 'events',
  kind: 'Event',
  namespaced: true,
  shortName: 'ev',
  verbs: ['create'],
  stored: false,
  create: (ctx, namespace, cluster) => createEvent(ctx.body, namespace, groupVersion, cluster),
});

const RESOURCES: readonly ApiResource[] = [
  PODS,
  NAMESPACES,
  NODES,
  SERVICE_ACCOUNTS,
  TOKEN_REVIEWS,
  events('v1'),
  events('events.k8s.io/v1'),
];

export const DISCOVERED: readonly DiscoveredResource[] = RESOURCES;

export function resourceRoutes(cluster: Cluster): Route[] {
  return RESOURCES.flatMap((resource) =>
    resource.stored ? storedRoutes(resource, cluster) : actionRoutes(resource, cluster),
  );
}

/** A collection, cluster-wide or in the captured namespace, or with `item` one object of it by its captured name. */
function resourcePath(resource: DiscoveredResource, inNamespace: boolean, item = false): RegExp {
  const base = resource.groupVersion === 'v1' ? '/api/v1' : `/apis/${resource.groupVersion}`;
  const namespace = inNamespace ? '/namespaces/([^/]+)' : '';
  return new RegExp(`^${escapeRegExp(base)}${namespace}/${escapeRegExp(resource.name)}${item ? '/([^/]+)' : ''}$`);
}

/** One object of a resource: its name, and its namespace when the resource is namespaced. */
type ItemName = { readonly namespace?: string; readonly name: string };

/** The item path's capture groups: namespace and name, or the name alone. */
function itemOf(resource: StoredResource, [first, second]: [string, string]): ItemName {
  return resource.namespaced ? { namespace: first, name: second } : { name: first };
}

function storedRoutes(resource: StoredApiResource, cluster: Cluster): Route[] {
  const routes: Route[] = [];
  if (resource.verbs.includes('list')) {
    routes.push({
      method: 'GET',
      pattern: resourcePath(resource, false),
      handle: (ctx) => collection(ctx, resource, cluster),
    });
    if (resource.namespaced) {
      routes.push({
        method: 'GET',
        pattern: resourcePath(resource, true),
        handle: (ctx, [namespace]) => collection(ctx, resource, cluster, namespace),
      });
    }
  }
  if (resource.verbs.includes('get')) {
    routes.push({
      method: 'GET',
      pattern: resourcePath(resource, resource.namespaced, true),
      handle: (_ctx, params) => getObject(resource, itemOf(resource, params), cluster),
    });
  }
  if (resource.verbs.includes('patch')) {
    routes.push({
      method: 'PATCH',
      pattern: resourcePath(resource, resource.namespaced, true),
      handle: (ctx, params) => patchObject(ctx, resource, itemOf(resource, params), cluster),
    });
  }
  return routes;
}

function actionRoutes(resource: ActionApiResource, cluster: Cluster): Route[] {
  return [
    {
      method: 'POST',
      pattern: resourcePath(resource, resource.namespaced),
      handle: (ctx, [namespace]) => resource.create(ctx, resource.namespaced ? namespace : undefined, cluster),
    },
  ];
}

function getObject(resource: StoredResource, item: ItemName, { store }: Cluster): Reply {
  const object = store.get(resource, objectKey(resource, item));
  if (!object) throw new ApiError(404, `${resource.name} "${item.name}" not found`);
  return { status: 200, body: object };
}

function collection(
  ctx: RequestContext,
  resource: StoredResource,
  { store, watches }: Cluster,
  namespace?: string,
): Reply {
  const matches = objectPredicate(ctx.query, namespace);
  if (isWatchRequest(ctx.query)) {
    watches.open(ctx.res, ctx.query, resource, matches);
    return undefined;
  }
  // limit/continue are ignored: returning everything without a continue token is a valid answer.
  return {
    status: 200,
    body: {
      kind: `${resource.kind}List`,
      apiVersion: 'v1',
      metadata: { resourceVersion: String(store.resourceVersion) },
      items: store.list(resource).filter(matches),
    },
  };
}

function patchObject(ctx: RequestContext, resource: StoredApiResource, item: ItemName, { store }: Cluster): Reply {
  const current = store.get(resource, objectKey(resource, item));
  if (!current) throw new ApiError(404, `${resource.name} "${item.name}" not found`);
  const patched = applyPatch(current, ctx.contentType, ctx.body);
  if (!isPlainObject(patched.metadata)) throw new ApiError(422, 'metadata must be an object');
  resource.validate?.(patched);
  // Identity fields are immutable; a patch cannot rename, move or re-create the object.
  const { uid, creationTimestamp } = current.metadata;
  return {
    status: 200,
    body: store.put(resource, { ...patched, metadata: { ...patched.metadata, ...item, uid, creationTimestamp } }),
  };
}

function createEvent(body: unknown, namespace: string | undefined, apiVersion: string, cluster: Cluster): Reply {
  if (!isPlainObject(body)) throw new ApiError(400, 'event body must be a JSON object');
  const metadata = isPlainObject(body.metadata) ? body.metadata : {};
  const prefix = typeof metadata.generateName === 'string' ? metadata.generateName : 'event.';
  const name = typeof metadata.name === 'string' ? metadata.name : `${prefix}${randomUUID()}`;
  const event = {
    ...body,
    apiVersion,
    kind: 'Event',
    metadata: {
      ...metadata,
      name,
      namespace,
      uid: randomUUID(),
      resourceVersion: String(cluster.store.nextResourceVersion()),
      creationTimestamp: nowIso(),
    },
  };
  cluster.recordEvent(event);
  return { status: 201, body: event };
}
