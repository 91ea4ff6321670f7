/**
 * The discovery documents kubectl and client-node read before anything else, derived from the
 * resources served, so that what discovery announces and what the routes serve cannot drift apart.
 */
import { type Route, escapeRegExp } from './routing.js';

/** A resource as discovery describes it. */
export interface DiscoveredResource {
  /** `v1` for the core group, `group/version` otherwise. */
  readonly groupVersion: string;
  readonly name: string;
  readonly kind: string;
  readonly namespaced: boolean;
  readonly shortName?: string;
  readonly verbs: readonly string[];
}

const VERSION = {
  major: '1',
  minor: '31',
  gitVersion: 'v1.31.0',
  gitCommit: '0000000000000000000000000000000000000000',
  gitTreeState: 'clean',
  buildDate: '2024-08-13T00:00:00Z',
  goVersion: 'go1.22.5',
  compiler: 'gc',
  platform: 'linux/amd64',
};

const CORE = 'v1';

/** `/version`, `/api`, `/apis` and one resource list per group version; `address` is the server's host:port. */
export function discoveryRoutes(resources: readonly DiscoveredResource[], address: () => string): Route[] {
  const ok = (body: unknown) => () => ({ status: 200, body });
  const groupVersions = [...new Set(resources.map((resource) => resource.groupVersion))].filter((gv) => gv !== CORE);
  const resourceList = (groupVersion: string) => ({
    kind: 'APIResourceList',
    // The real server omits apiVersion on the core group's list only.
    ...(groupVersion === CORE ? {} : { apiVersion: 'v1' }),
    groupVersion,
    resources: resources
      .filter((resource) => resource.groupVersion === groupVersion)
      .map((resource) => ({
        name: resource.name,
        singularName: resource.kind.toLowerCase(),
        namespaced: resource.namespaced,
        kind: resource.kind,
        verbs: resource.verbs,
        ...(resource.shortName ? { shortNames: [resource.shortName] } : {}),
      })),
  });
  const groupList = {
    kind: 'APIGroupList',
    apiVersion: 'v1',
    groups: groupVersions.map((groupVersion) => {
      const [name = '', version = ''] = groupVersion.split('/');
      return { name, versions: [{ groupVersion, version }], preferredVersion: { groupVersion, version } };
    }),
  };
  return [
    { method: 'GET', pattern: /^\/version$/, handle: ok(VERSION) },
    {
      method: 'GET',
      pattern: /^\/api$/,
      handle: () =>
        ok({
          kind: 'APIVersions',
          versions: [CORE],
          serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: address() }],
        })(),
    },
    { method: 'GET', pattern: /^\/apis$/, handle: ok(groupList) },
    { method: 'GET', pattern: /^\/api\/v1$/, handle: ok(resourceList(CORE)) },
    ...groupVersions.map((groupVersion) => ({
      method: 'GET',
      pattern: new RegExp(`^/apis/${escapeRegExp(groupVersion)}$`),
      handle: ok(resourceList(groupVersion)),
    })),
  ];
}
