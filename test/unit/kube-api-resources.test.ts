/**
 * The fake API server's discovery and routes come from one resource table: whatever discovery
 * announces is served, at the paths kubectl and client-node build from it, and nothing else is.
 */
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { describe, it } from 'node:test';
import { discoveryRoutes } from '../../src/sandbox/kube-api/discovery.js';
import { DISCOVERED, NODES, resourceRoutes } from '../../src/sandbox/kube-api/resources.js';
import { type Reply, type RequestContext, dispatch } from '../../src/sandbox/kube-api/routing.js';
import { ApiError } from '../../src/sandbox/kube-api/status.js';
import { ServiceAccountTokens } from '../../src/sandbox/kube-api/service-account-tokens.js';
import { ObjectStore } from '../../src/sandbox/kube-api/store.js';
import { Watches } from '../../src/sandbox/kube-api/watch.js';

interface ResourceList {
  groupVersion: string;
  resources: Array<{ name: string; namespaced: boolean; verbs: string[] }>;
}

function cluster() {
  const store = new ObjectStore();
  const events: unknown[] = [];
  const routes = [
    ...discoveryRoutes(DISCOVERED, () => '127.0.0.1:6443'),
    ...resourceRoutes({
      store,
      watches: new Watches(store),
      tokens: new ServiceAccountTokens(),
      recordEvent: (event) => events.push(event),
    }),
  ];
  const request = (method: string, path: string, body?: unknown): Reply => {
    const ctx: RequestContext = {
      method,
      query: new URLSearchParams(),
      contentType: 'application/merge-patch+json',
      body,
      res: undefined as unknown as ServerResponse,
    };
    return dispatch(routes, ctx, path);
  };
  const status = (method: string, path: string, body?: unknown): number => {
    try {
      return request(method, path, body)?.status ?? 0;
    } catch (error) {
      if (error instanceof ApiError) return error.code;
      throw error;
    }
  };
  return { store, events, request, status };
}

/** Every resource list discovery announces, as a client walks it from /api and /apis. */
function announced(request: ReturnType<typeof cluster>['request']): ResourceList[] {
  const groups = (request('GET', '/apis')?.body as { groups: Array<{ preferredVersion: { groupVersion: string } }> })
    .groups;
  return [
    request('GET', '/api/v1')?.body as ResourceList,
    ...groups.map(
      ({ preferredVersion }) => request('GET', `/apis/${preferredVersion.groupVersion}`)?.body as ResourceList,
    ),
  ];
}

describe('fake API server resource table', () => {
  it('serves every verb discovery announces, at the path a client builds from discovery', () => {
    const { request, status } = cluster();
    const lists = announced(request);
    assert.deepEqual(
      lists.map((list) => list.groupVersion),
      ['v1', 'authentication.k8s.io/v1', 'events.k8s.io/v1'],
    );
    for (const list of lists) {
      const base = list.groupVersion === 'v1' ? '/api/v1' : `/apis/${list.groupVersion}`;
      for (const resource of list.resources) {
        const collection = `${base}${resource.namespaced ? '/namespaces/team-a' : ''}/${resource.name}`;
        const what = `${list.groupVersion} ${resource.name}`;
        // A missing object is a 404 from the handler, not an unknown path: the status says which.
        if (resource.verbs.includes('list')) assert.equal(status('GET', collection), 200, `${what} list`);
        if (resource.verbs.includes('get')) assert.equal(status('GET', `${collection}/nope`), 404, `${what} get`);
        if (resource.verbs.includes('patch')) assert.equal(status('PATCH', `${collection}/nope`), 404, `${what} patch`);
        const body = resource.name === 'tokenreviews' ? { spec: { token: 'not.a.token' } } : {};
        if (resource.verbs.includes('create')) assert.equal(status('POST', collection, body), 201, `${what} create`);
        if (!resource.verbs.includes('create')) assert.equal(status('POST', collection, {}), 405, `${what} no create`);
      }
    }
  });

  it('answers 404 for a resource discovery does not announce', () => {
    const { status } = cluster();
    assert.equal(status('GET', '/api/v1/secrets'), 404);
    assert.equal(status('GET', '/apis/authentication.k8s.io/v1/selfsubjectreviews'), 404);
  });

  it('reads and patches stored objects through the routes', () => {
    const { store, request } = cluster();
    store.put(NODES, { metadata: { name: 'node-a' } });
    const patched = request('PATCH', '/api/v1/nodes/node-a', {
      metadata: { name: 'renamed' },
      spec: { unschedulable: true },
    });
    assert.equal(patched?.status, 200);
    const node = request('GET', '/api/v1/nodes/node-a')?.body as { metadata: { name: string }; spec: unknown };
    assert.equal(node.metadata.name, 'node-a', 'a patch cannot rename');
    assert.deepEqual(node.spec, { unschedulable: true });
  });
});
