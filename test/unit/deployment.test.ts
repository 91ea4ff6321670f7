/**
 * The deployment artifacts agree with the code: the manifests `kubectl apply -k k8s/` installs
 * (rendered offline by the real kubectl) and the Dockerfile. The agent's own option list and
 * configuration loader judge every BROKER_* variable, so a renamed or retyped option fails here.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { describe, it } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { z } from 'zod';
import { loadConfig } from '../../src/config/load.js';
import { optionEntries } from '../../src/config/schema.js';

const ROOT = new URL('../../', import.meta.url);
const { version, engines } = JSON.parse(readFileSync(new URL('package.json', ROOT), 'utf8')) as { version: string; engines: { node: string } };
const SCHEMA_VARIABLES = new Set(optionEntries().map(([, spec]) => spec.env));

const Metadata = z.object({ name: z.string(), namespace: z.string().optional() });
const EnvVar = z.object({ name: z.string(), value: z.string().optional(), valueFrom: z.object({ fieldRef: z.object({ fieldPath: z.string() }) }).optional() });
const HttpProbe = z.object({ httpGet: z.object({ host: z.string(), port: z.number(), path: z.string() }) });
const Container = z.object({
  image: z.string(),
  env: z.array(EnvVar),
  ports: z.array(z.object({ name: z.string(), containerPort: z.number() })),
  startupProbe: HttpProbe,
  livenessProbe: HttpProbe,
  readinessProbe: HttpProbe,
  resources: z.object({ requests: z.object({ cpu: z.string(), memory: z.string() }), limits: z.object({ memory: z.string() }) }),
  securityContext: z.object({
    allowPrivilegeEscalation: z.literal(false),
    readOnlyRootFilesystem: z.literal(true),
    capabilities: z.object({ add: z.array(z.string()), drop: z.array(z.string()) }),
  }),
});
const DaemonSet = z.object({
  kind: z.literal('DaemonSet'),
  metadata: Metadata,
  spec: z.object({
    updateStrategy: z.object({ type: z.literal('RollingUpdate') }),
    template: z.object({
      spec: z.object({
        serviceAccountName: z.string(),
        hostNetwork: z.literal(true),
        enableServiceLinks: z.literal(false),
        priorityClassName: z.literal('system-node-critical'),
        tolerations: z.array(z.object({ operator: z.string(), key: z.string().optional(), effect: z.string().optional() })),
        containers: z.array(Container).length(1),
      }),
    }),
  }),
});
const Rule = z.object({ apiGroups: z.array(z.string()), resources: z.array(z.string()), verbs: z.array(z.string()) });
const ClusterRole = z.object({ kind: z.literal('ClusterRole'), metadata: Metadata, rules: z.array(Rule) });
const ClusterRoleBinding = z.object({
  kind: z.literal('ClusterRoleBinding'),
  roleRef: z.object({ kind: z.literal('ClusterRole'), name: z.string() }),
  subjects: z.array(z.object({ kind: z.string(), name: z.string(), namespace: z.string() })).length(1),
});

function render(directory = 'k8s/'): Array<{ kind: string; metadata: z.infer<typeof Metadata> } & Record<string, unknown>> {
  const text = execFileSync('kubectl', ['kustomize', directory], { cwd: ROOT, encoding: 'utf8' });
  return parseAllDocuments(text).map((document) => {
    assert.deepEqual(document.errors, []);
    return z.object({ kind: z.string(), metadata: Metadata }).loose().parse(document.toJS());
  });
}

const only = <T>(objects: ReturnType<typeof render>, kind: string, schema: z.ZodType<T>): T => {
  const matching = objects.filter((object) => object.kind === kind);
  assert.equal(matching.length, 1, `one ${kind}`);
  return schema.parse(matching[0]);
};

/** Kubernetes expands $(NAME) from earlier variables; fieldRefs get the values a node would give. */
function resolvedBrokerEnv(env: z.infer<typeof EnvVar>[]): Record<string, string> {
  const downward: Record<string, string> = { 'spec.nodeName': 'ip-10-0-1-23.ec2.internal', 'status.hostIP': '10.0.1.23' };
  const values: Record<string, string> = {};
  for (const variable of env) {
    const raw = variable.valueFrom ? downward[variable.valueFrom.fieldRef.fieldPath] : variable.value;
    assert.ok(raw !== undefined, `${variable.name} has a value`);
    values[variable.name] = raw.replace(/\$\((\w+)\)/g, (_, name: string) => values[name] ?? assert.fail(`${variable.name} refers to $(${name}), which is not defined before it`));
  }
  return Object.fromEntries(Object.entries(values).filter(([name]) => name.startsWith('BROKER_')));
}

describe('k8s/ (kubectl kustomize)', () => {
  const objects = render();
  const daemonSet = only(objects, 'DaemonSet', DaemonSet);
  const pod = daemonSet.spec.template.spec;
  const container = pod.containers[0] as z.infer<typeof Container>;

  it('installs a namespace, a service account, a cluster role and binding, and the DaemonSet, all in one namespace', () => {
    assert.deepEqual(objects.map((object) => object.kind).sort(), ['ClusterRole', 'ClusterRoleBinding', 'DaemonSet', 'Namespace', 'ServiceAccount']);
    const namespace = only(objects, 'Namespace', z.object({ metadata: Metadata })).metadata.name;
    for (const object of objects.filter((o) => o.kind === 'ServiceAccount' || o.kind === 'DaemonSet')) assert.equal(object.metadata.namespace, namespace, object.kind);
    const serviceAccount = only(objects, 'ServiceAccount', z.object({ metadata: Metadata })).metadata;
    const binding = only(objects, 'ClusterRoleBinding', ClusterRoleBinding);
    assert.equal(binding.roleRef.name, only(objects, 'ClusterRole', ClusterRole).metadata.name);
    assert.deepEqual(binding.subjects[0], { kind: 'ServiceAccount', name: serviceAccount.name, namespace });
    assert.equal(pod.serviceAccountName, serviceAccount.name);
  });

  it('grants exactly list/watch on pods and namespaces, create on events, get/patch on nodes', () => {
    const granted = only(objects, 'ClusterRole', ClusterRole).rules.flatMap((rule) =>
      rule.apiGroups.flatMap((group) => rule.resources.flatMap((resource) => rule.verbs.map((verb) => `${group || 'core'}/${resource}:${verb}`))),
    );
    assert.deepEqual(granted.sort(), ['core/events:create', 'core/namespaces:list', 'core/namespaces:watch', 'core/nodes:get', 'core/nodes:patch', 'core/pods:list', 'core/pods:watch', 'events.k8s.io/events:create'].sort());
  });

  it('runs on every node in the host network with NET_ADMIN as the only capability', () => {
    assert.ok(pod.tolerations.some((toleration) => toleration.operator === 'Exists' && toleration.key === undefined && toleration.effect === undefined), 'tolerates every taint');
    assert.deepEqual(container.securityContext.capabilities, { add: ['NET_ADMIN'], drop: ['ALL'] });
  });

  it('runs the image of this version', () => {
    assert.equal(container.image, `kube-iam-broker:${version}`);
  });

  it('sets only BROKER_* variables the agent knows, with values its configuration loader accepts', () => {
    const broker = resolvedBrokerEnv(container.env);
    for (const name of Object.keys(broker)) assert.ok(SCHEMA_VARIABLES.has(name), `${name} is not an option in src/config/schema.ts`);
    const config = loadConfig([], broker);
    assert.equal(config.nodeName, 'ip-10-0-1-23.ec2.internal', 'BROKER_NODE_NAME comes from spec.nodeName');
    assert.equal(config.listen, '10.0.1.23:8181', 'the metadata server listens on the node IP (status.hostIP)');
    assert.equal(config.graceWindowMs, undefined, 'unset: each SDK is held as long as it waits, not capped');
    const metadataPort = container.ports.find((port) => port.name === 'metadata')?.containerPort;
    assert.equal(`${config.listen.split(':')[0]}:${metadataPort}`, config.listen, 'the declared port is the one the agent listens on');
  });

  it('probes the admin server where the agent puts it: health for liveness, informer sync for readiness', () => {
    const config = loadConfig([], resolvedBrokerEnv(container.env));
    for (const probe of [container.startupProbe, container.livenessProbe, container.readinessProbe]) {
      assert.equal(`${probe.httpGet.host}:${probe.httpGet.port}`, config.adminListen);
    }
    assert.equal(container.livenessProbe.httpGet.path, '/healthz');
    assert.equal(container.readinessProbe.httpGet.path, '/readyz');
  });

  it('mentions no BROKER_* variable, even in comments, that the agent does not know', () => {
    const directory = new URL('k8s/', ROOT);
    for (const file of readdirSync(directory, { recursive: true, encoding: 'utf8' }).filter((name) => name.endsWith('.yaml'))) {
      for (const [name] of readFileSync(new URL(file, directory), 'utf8').matchAll(/\bBROKER_[A-Z0-9_]+/g)) assert.ok(SCHEMA_VARIABLES.has(name), `${file}: ${name}`);
    }
  });
});

const CleanupDaemonSet = z.object({
  kind: z.literal('DaemonSet'),
  metadata: Metadata,
  spec: z.object({
    template: z.object({
      spec: z.object({
        hostNetwork: z.literal(true),
        automountServiceAccountToken: z.literal(false),
        tolerations: z.array(z.object({ operator: z.string(), key: z.string().optional(), effect: z.string().optional() })),
        initContainers: z.array(
          z.object({
            image: z.string(),
            args: z.array(z.string()),
            securityContext: z.object({ allowPrivilegeEscalation: z.literal(false), capabilities: z.object({ add: z.array(z.string()), drop: z.array(z.string()) }) }),
            volumeMounts: z.array(z.object({ name: z.string(), mountPath: z.string() })),
          }),
        ).length(1),
        containers: z.array(z.object({ image: z.string(), args: z.array(z.string()).optional(), command: z.array(z.string()).optional() })).length(1),
      }),
    }),
  }),
});

describe('k8s/uninstall/ (kubectl kustomize): node-cleanup on every node', () => {
  const objects = render('k8s/uninstall/');
  const agent = only(render(), 'DaemonSet', DaemonSet);
  const cleanup = only(objects, 'DaemonSet', CleanupDaemonSet);
  const pod = cleanup.spec.template.spec;
  const [init] = pod.initContainers;

  it('is one DaemonSet, in the agent\'s namespace, that needs nothing from the API server', () => {
    assert.deepEqual(objects.map((object) => object.kind), ['DaemonSet']);
    assert.equal(cleanup.metadata.namespace, agent.metadata.namespace);
    assert.notEqual(cleanup.metadata.name, agent.metadata.name, 'it does not replace the agent');
  });

  it('runs `node-cleanup` from the agent\'s image of this version, on every node the agent ran on, as the agent reaches the node', () => {
    assert.deepEqual(init?.args, ['node-cleanup']);
    assert.equal(init?.image, `kube-iam-broker:${version}`);
    assert.ok(pod.tolerations.some((toleration) => toleration.operator === 'Exists' && toleration.key === undefined && toleration.effect === undefined), 'tolerates every taint');
    assert.deepEqual(init?.securityContext.capabilities, { add: ['NET_ADMIN'], drop: ['ALL'] });
    const volumes = (daemonSet: unknown) =>
      z.object({ spec: z.object({ template: z.object({ spec: z.object({ volumes: z.array(z.object({ name: z.string(), hostPath: z.object({ path: z.string() }).optional() })) }) }) }) }).parse(daemonSet).spec.template.spec.volumes;
    const xtablesLock = (daemonSet: unknown) => volumes(daemonSet).find((volume) => volume.hostPath?.path === '/run/xtables.lock');
    const lock = xtablesLock(objects[0]);
    assert.ok(xtablesLock(render().find((object) => object.kind === 'DaemonSet')) && lock, 'both mount the node\'s xtables lock');
    assert.ok(init?.volumeMounts.some((mount) => mount.name === lock?.name && mount.mountPath === '/run/xtables.lock'), 'where iptables takes it, serialised with kube-proxy');
  });

  it('then only idles, so rollout status reports when every node is clean', () => {
    const [done] = pod.containers;
    assert.match(done?.image ?? '', /^registry\.k8s\.io\/pause:/);
    assert.equal(done?.args, undefined);
    assert.equal(done?.command, undefined);
  });
});

describe('Dockerfile', () => {
  const dockerfile = readFileSync(new URL('Dockerfile', ROOT), 'utf8');

  it('builds with the recipe CI runs, on the Node major the package requires, and ships only its output', () => {
    assert.match(dockerfile, /^RUN bash scripts\/build-image\.sh --rootfs \/staging$/m);
    assert.match(dockerfile, /^COPY --from=build \/staging\/app \/app$/m);
    const major = /(\d+)/.exec(engines.node)?.[1];
    const bases = [...dockerfile.matchAll(/^FROM (\S+)/gm)].map((match) => match[1]);
    assert.deepEqual(bases, [`node:${major}-bookworm-slim`, `node:${major}-bookworm-slim`]);
    assert.match(dockerfile, /^ENTRYPOINT \["\/usr\/bin\/tini", "--", "node", "\/app\/dist\/cli\.js"\]$/m);
  });
});
