/**
 * The deployment artifacts agree with the code: the manifests `kubectl apply -k k8s/` installs
 * (rendered offline by the real kubectl) and the Dockerfile. The agent's own option list and
 * configuration loader judge every BROKER_* variable, so a renamed or retyped option fails here.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
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
  name: z.string(),
  image: z.string(),
  env: z.array(EnvVar),
  ports: z.array(z.object({ name: z.string(), containerPort: z.number(), protocol: z.literal('TCP') })),
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
    updateStrategy: z.object({ type: z.literal('RollingUpdate'), rollingUpdate: z.object({ maxUnavailable: z.union([z.string(), z.number()]), maxSurge: z.number() }) }),
    template: z.object({
      metadata: z.object({ labels: z.record(z.string(), z.string()), annotations: z.record(z.string(), z.string()) }),
      spec: z.object({
        affinity: z.object({
          nodeAffinity: z.object({
            requiredDuringSchedulingIgnoredDuringExecution: z.object({
              nodeSelectorTerms: z.array(z.object({ matchExpressions: z.array(z.object({ key: z.string(), operator: z.string(), values: z.array(z.string()) })) })),
            }),
          }),
        }),
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

/** `kubectl kustomize k8s/`, or an overlay of it with the named components, as a user would write it. */
function render(components: readonly string[] = []): Array<{ kind: string; metadata: z.infer<typeof Metadata> } & Record<string, unknown>> {
  let directory = fileURLToPath(new URL('k8s/', ROOT));
  const overlay = components.length > 0 ? mkdtempSync(join(tmpdir(), 'overlay-')) : undefined;
  if (overlay) {
    const base = relative(overlay, directory);
    writeFileSync(join(overlay, 'kustomization.yaml'), `resources: [${base}]\ncomponents: [${components.map((name) => `${base}/components/${name}`).join(', ')}]\n`);
    directory = overlay;
  }
  let text: string;
  try {
    text = execFileSync('kubectl', ['kustomize', directory], { encoding: 'utf8' });
  } finally {
    if (overlay) rmSync(overlay, { recursive: true, force: true });
  }
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

  const granted = (rendered: ReturnType<typeof render>) =>
    only(rendered, 'ClusterRole', ClusterRole)
      .rules.flatMap((rule) => rule.apiGroups.flatMap((group) => rule.resources.flatMap((resource) => rule.verbs.map((verb) => `${group || 'core'}/${resource}:${verb}`))))
      .sort();
  const BASE_GRANTS = ['core/events:create', 'core/namespaces:list', 'core/namespaces:watch', 'core/pods:list', 'core/pods:watch', 'events.k8s.io/events:create'];

  it('grants exactly list/watch on pods and namespaces and create on events: nothing on nodes without the readiness taint', () => {
    assert.deepEqual(granted(objects), BASE_GRANTS.sort());
    assert.ok(!container.env.some((variable) => variable.name === 'BROKER_NODE_TAINT'));
  });

  it('components/readiness-taint adds the taint option and get/patch on nodes, nothing else', () => {
    const withTaint = render(['readiness-taint']);
    assert.deepEqual(granted(withTaint), [...BASE_GRANTS, 'core/nodes:get', 'core/nodes:patch'].sort());
    const tainted = only(withTaint, 'DaemonSet', DaemonSet).spec.template.spec.containers[0] as z.infer<typeof Container>;
    const config = loadConfig([], resolvedBrokerEnv(tainted.env));
    assert.deepEqual([config.nodeTaint?.key, config.nodeTaint?.effect], ['kube-iam-broker/not-ready', 'NoSchedule']);
    assert.ok(pod.tolerations.some((toleration) => toleration.operator === 'Exists'), 'the agent tolerates its own taint');
  });

  it('runs only on Linux EC2 nodes (not Fargate, hybrid or Auto Mode), in the host network, with NET_ADMIN as the only capability', () => {
    const terms = pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms;
    assert.equal(terms.length, 1, 'one term: all its expressions must hold');
    assert.deepEqual(terms[0]?.matchExpressions, [
      { key: 'kubernetes.io/os', operator: 'In', values: ['linux'] },
      { key: 'eks.amazonaws.com/compute-type', operator: 'NotIn', values: ['fargate', 'hybrid', 'auto'] },
    ]);
    assert.deepEqual(container.securityContext.capabilities, { add: ['NET_ADMIN'], drop: ['ALL'] });
  });

  it('rolls out a percentage of nodes at a time, without surge (both agents need port 8181)', () => {
    assert.deepEqual(daemonSet.spec.updateStrategy.rollingUpdate, { maxUnavailable: '10%', maxSurge: 0 });
  });

  it('runs the image of this version from the registry placeholder the README says to set, in the container the README names', () => {
    assert.equal(container.image, `registry.invalid/kube-iam-broker:${version}`);
    const readme = readFileSync(new URL('README.md', ROOT), 'utf8');
    assert.ok(readme.includes('registry.invalid'), 'the README tells you to replace the placeholder');
    assert.match(readme, /@sha256:/, 'the README shows a digest pin');
    assert.equal(container.name, 'kube-iam-broker');
    assert.ok(readme.includes(`-c ${container.name}`), 'the README\'s kubectl commands name this container');
  });

  it('requests memory above the measured idle footprint and limits it above the measured peak', () => {
    const mebibytes = (quantity: string) => Number(/^(\d+)Mi$/.exec(quantity)?.[1] ?? Number.NaN);
    assert.ok(mebibytes(container.resources.requests.memory) >= 120, 'idle: ~120 MiB resident');
    assert.ok(mebibytes(container.resources.limits.memory) * 1.048576 > 207 * 1.25, '207 MB after 5,000 pods, plus a quarter');
    assert.equal(container.resources.requests.cpu, '50m');
  });

  it('declares the metrics port with the scrape annotations, and components/pod-monitor scrapes it', () => {
    const config = loadConfig([], resolvedBrokerEnv(container.env));
    assert.equal(config.metricsListen, '10.0.1.23:9181');
    const metricsPort = container.ports.find((port) => port.name === 'metrics')?.containerPort;
    assert.equal(`10.0.1.23:${metricsPort}`, config.metricsListen);
    assert.deepEqual(daemonSet.spec.template.metadata.annotations, { 'prometheus.io/scrape': 'true', 'prometheus.io/port': String(metricsPort), 'prometheus.io/path': '/metrics' });
    const monitor = z
      .object({ spec: z.object({ selector: z.object({ matchLabels: z.record(z.string(), z.string()) }), podMetricsEndpoints: z.array(z.object({ port: z.string(), path: z.string() })) }) })
      .parse(render(['pod-monitor']).find((object) => object.kind === 'PodMonitor'));
    assert.deepEqual(monitor.spec.selector.matchLabels, daemonSet.spec.template.metadata.labels);
    assert.deepEqual(monitor.spec.podMetricsEndpoints, [{ port: 'metrics', path: '/metrics' }]);
  });

  it('sets only BROKER_* variables the agent knows, with values its configuration loader accepts', () => {
    const broker = resolvedBrokerEnv(container.env);
    for (const name of Object.keys(broker)) assert.ok(SCHEMA_VARIABLES.has(name), `${name} is not an option in src/config/schema.ts`);
    const config = loadConfig([], broker);
    assert.equal(config.nodeName, 'ip-10-0-1-23.ec2.internal', 'BROKER_NODE_NAME comes from spec.nodeName');
    assert.equal(config.listen, '10.0.1.23:8181', 'the metadata server listens on the node IP (status.hostIP)');
    assert.equal(config.graceWindowMs, 300);
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
    const directory = fileURLToPath(new URL('k8s/', ROOT));
    const files = readdirSync(directory, { recursive: true, withFileTypes: true }).filter((entry) => entry.isFile());
    assert.ok(files.length >= 6);
    for (const file of files) {
      const path = join(file.parentPath, file.name);
      for (const [name] of readFileSync(path, 'utf8').matchAll(/\bBROKER_[A-Z0-9_]+/g)) assert.ok(SCHEMA_VARIABLES.has(name), `${path}: ${name}`);
    }
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
