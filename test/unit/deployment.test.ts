/**
 * The deployment artifacts agree with the code: the manifests `kubectl apply -k k8s/` installs
 * (rendered offline by the real kubectl) and the Dockerfile. The agent's own option list and
 * configuration loader judge every BROKER_* variable, so a renamed or retyped option fails here.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { z } from 'zod';
import { loadConfig } from '../../src/config/load.js';
import { optionEntries } from '../../src/config/schema.js';
import { wiringSettings } from '../../src/webhook/main.js';
import { WEBHOOK_PATHS } from '../../src/webhook/server.js';

const ROOT = new URL('../../', import.meta.url);
const { version, engines } = JSON.parse(readFileSync(new URL('package.json', ROOT), 'utf8')) as {
  version: string;
  engines: { node: string };
};
const CLUSTER_SCOPED = new Set(['Namespace', 'ClusterRole', 'ClusterRoleBinding', 'MutatingWebhookConfiguration']);
const SCHEMA_VARIABLES = new Set(optionEntries().map(([, spec]) => spec.env));

const Metadata = z.object({ name: z.string(), namespace: z.string().optional() }).loose();
const EnvVar = z.object({
  name: z.string(),
  value: z.string().optional(),
  valueFrom: z.object({ fieldRef: z.object({ fieldPath: z.string() }) }).optional(),
});
const HttpProbe = z.object({ httpGet: z.object({ host: z.string(), port: z.number(), path: z.string() }) });
const Container = z.object({
  name: z.string(),
  image: z.string(),
  env: z.array(EnvVar),
  ports: z.array(z.object({ name: z.string(), containerPort: z.number(), protocol: z.literal('TCP') })),
  startupProbe: HttpProbe,
  livenessProbe: HttpProbe,
  readinessProbe: HttpProbe,
  resources: z.object({
    requests: z.object({ cpu: z.string(), memory: z.string() }),
    limits: z.object({ memory: z.string() }),
  }),
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
    updateStrategy: z.object({
      type: z.literal('RollingUpdate'),
      rollingUpdate: z.object({ maxUnavailable: z.union([z.string(), z.number()]), maxSurge: z.number() }),
    }),
    template: z.object({
      metadata: z.object({ labels: z.record(z.string(), z.string()), annotations: z.record(z.string(), z.string()) }),
      spec: z.object({
        affinity: z.object({
          nodeAffinity: z.object({
            requiredDuringSchedulingIgnoredDuringExecution: z.object({
              nodeSelectorTerms: z.array(
                z.object({
                  matchExpressions: z.array(
                    z.object({ key: z.string(), operator: z.string(), values: z.array(z.string()) }),
                  ),
                }),
              ),
            }),
          }),
        }),
        serviceAccountName: z.string(),
        hostNetwork: z.literal(true),
        enableServiceLinks: z.literal(false),
        priorityClassName: z.literal('system-node-critical'),
        tolerations: z.array(
          z.object({ operator: z.string(), key: z.string().optional(), effect: z.string().optional() }),
        ),
        containers: z.array(Container).length(1),
      }),
    }),
  }),
});
const Rule = z.object({
  apiGroups: z.array(z.string()),
  resources: z.array(z.string()),
  resourceNames: z.array(z.string()).optional(),
  verbs: z.array(z.string()),
});
const ClusterRole = z.object({ kind: z.literal('ClusterRole'), metadata: Metadata, rules: z.array(Rule) });
const ClusterRoleBinding = z.object({
  kind: z.literal('ClusterRoleBinding'),
  roleRef: z.object({ kind: z.literal('ClusterRole'), name: z.string() }),
  subjects: z.array(z.object({ kind: z.string(), name: z.string(), namespace: z.string() })).length(1),
});

function render(
  directory = 'k8s/',
): Array<{ kind: string; metadata: z.infer<typeof Metadata> } & Record<string, unknown>> {
  const text = execFileSync('kubectl', ['kustomize', '--load-restrictor', 'LoadRestrictionsNone', directory], {
    cwd: ROOT,
    encoding: 'utf8',
  });
  return parseAllDocuments(text).map((document) => {
    assert.deepEqual(document.errors, []);
    return z.object({ kind: z.string(), metadata: Metadata }).loose().parse(document.toJS());
  });
}

const only = <T>(objects: ReturnType<typeof render>, kind: string, schema: z.ZodType<T>, name?: string): T => {
  const matching = objects.filter(
    (object) => object.kind === kind && (name === undefined || object.metadata.name === name),
  );
  assert.equal(matching.length, 1, `one ${kind}${name ? ` ${name}` : ''}`);
  return schema.parse(matching[0]);
};

/** Every rule as group/resource[/name]:verb, sorted. */
const grants = (rules: z.infer<typeof Rule>[]): string[] =>
  rules
    .flatMap((rule) =>
      rule.apiGroups.flatMap((group) =>
        rule.resources.flatMap((resource) =>
          (rule.resourceNames ?? ['']).flatMap((name) =>
            rule.verbs.map((verb) => `${group || 'core'}/${resource}${name ? `/${name}` : ''}:${verb}`),
          ),
        ),
      ),
    )
    .sort();

/** Kubernetes expands $(NAME) from earlier variables; fieldRefs get the values a node would give. */
function resolvedBrokerEnv(env: z.infer<typeof EnvVar>[]): Record<string, string> {
  const downward: Record<string, string> = {
    'spec.nodeName': 'ip-10-0-1-23.ec2.internal',
    'status.hostIP': '10.0.1.23',
  };
  const values: Record<string, string> = {};
  for (const variable of env) {
    const raw = variable.valueFrom ? downward[variable.valueFrom.fieldRef.fieldPath] : variable.value;
    assert.ok(raw !== undefined, `${variable.name} has a value`);
    values[variable.name] = raw.replace(
      /\$\((\w+)\)/g,
      (_, name: string) =>
        values[name] ?? assert.fail(`${variable.name} refers to $(${name}), which is not defined before it`),
    );
  }
  return Object.fromEntries(Object.entries(values).filter(([name]) => name.startsWith('BROKER_')));
}

describe('k8s/ (kubectl kustomize)', () => {
  const objects = render();
  const daemonSet = only(objects, 'DaemonSet', DaemonSet);
  const pod = daemonSet.spec.template.spec;
  const container = pod.containers[0] as z.infer<typeof Container>;

  it('installs a namespace, a service account, a cluster role and binding, and the DaemonSet, all in one namespace', () => {
    const agentObjects = objects.filter(
      (object) => object.metadata.name === 'kube-iam-broker' && object.kind !== 'MutatingWebhookConfiguration',
    );
    assert.deepEqual(agentObjects.map((object) => object.kind).sort(), [
      'ClusterRole',
      'ClusterRoleBinding',
      'DaemonSet',
      'Namespace',
      'ServiceAccount',
    ]);
    const namespace = only(objects, 'Namespace', z.object({ metadata: Metadata })).metadata.name;
    for (const object of objects.filter((o) => !CLUSTER_SCOPED.has(o.kind)))
      assert.equal(object.metadata.namespace, namespace, `${object.kind} ${object.metadata.name}`);
    const serviceAccount = only(
      objects,
      'ServiceAccount',
      z.object({ metadata: Metadata }),
      'kube-iam-broker',
    ).metadata;
    const binding = only(objects, 'ClusterRoleBinding', ClusterRoleBinding, 'kube-iam-broker');
    assert.equal(binding.roleRef.name, only(objects, 'ClusterRole', ClusterRole, 'kube-iam-broker').metadata.name);
    assert.deepEqual(binding.subjects[0], { kind: 'ServiceAccount', name: serviceAccount.name, namespace });
    assert.equal(pod.serviceAccountName, serviceAccount.name);
  });

  const granted = (rendered: ReturnType<typeof render>) =>
    grants(only(rendered, 'ClusterRole', ClusterRole, 'kube-iam-broker').rules);
  const BASE_GRANTS = [
    'authentication.k8s.io/tokenreviews:create',
    'core/events:create',
    'core/namespaces:list',
    'core/namespaces:watch',
    'core/pods:list',
    'core/pods:watch',
    'core/serviceaccounts:list',
    'core/serviceaccounts:watch',
    'events.k8s.io/events:create',
  ];

  it('grants exactly list/watch on pods, namespaces and service accounts, create on tokenreviews and events: nothing on nodes without the readiness taint', () => {
    assert.deepEqual(granted(objects), BASE_GRANTS.sort());
    assert.ok(!container.env.some((variable) => variable.name === 'BROKER_NODE_TAINT'));
  });

  it('components/readiness-taint adds the taint option and get/patch on nodes, nothing else', () => {
    const withTaint = render('test/fixtures/kustomize-readiness-taint/');
    assert.deepEqual(granted(withTaint), [...BASE_GRANTS, 'core/nodes:get', 'core/nodes:patch'].sort());
    const tainted = only(withTaint, 'DaemonSet', DaemonSet).spec.template.spec.containers[0] as z.infer<
      typeof Container
    >;
    const config = loadConfig([], resolvedBrokerEnv(tainted.env));
    assert.deepEqual([config.nodeTaint?.key, config.nodeTaint?.effect], ['kube-iam-broker/not-ready', 'NoSchedule']);
    assert.ok(
      pod.tolerations.some((toleration) => toleration.operator === 'Exists'),
      'the agent tolerates its own taint',
    );
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
    assert.ok(readme.includes(`-c ${container.name}`), "the README's kubectl commands name this container");
  });

  it('requests memory above the measured idle footprint and limits it above the measured peak', () => {
    const mebibytes = (quantity: string) => Number(/^(\d+)Mi$/.exec(quantity)?.[1] ?? Number.NaN);
    assert.ok(mebibytes(container.resources.requests.memory) >= 120, 'idle: ~120 MiB resident');
    assert.ok(
      mebibytes(container.resources.limits.memory) * 1.048576 > 207 * 1.25,
      '207 MB after 5,000 pods, plus a quarter',
    );
    assert.equal(container.resources.requests.cpu, '50m');
  });

  it('declares the metrics port with the scrape annotations, and components/pod-monitor scrapes it', () => {
    const config = loadConfig([], resolvedBrokerEnv(container.env));
    assert.equal(config.metricsListen, '10.0.1.23:9181');
    const metricsPort = container.ports.find((port) => port.name === 'metrics')?.containerPort;
    assert.equal(`10.0.1.23:${metricsPort}`, config.metricsListen);
    assert.deepEqual(daemonSet.spec.template.metadata.annotations, {
      'prometheus.io/scrape': 'true',
      'prometheus.io/port': String(metricsPort),
      'prometheus.io/path': '/metrics',
    });
    const monitor = z
      .object({
        spec: z.object({
          selector: z.object({ matchLabels: z.record(z.string(), z.string()) }),
          podMetricsEndpoints: z.array(z.object({ port: z.string(), path: z.string() })),
        }),
      })
      .parse(render('test/fixtures/kustomize-pod-monitor/').find((object) => object.kind === 'PodMonitor'));
    assert.deepEqual(monitor.spec.selector.matchLabels, daemonSet.spec.template.metadata.labels);
    assert.deepEqual(monitor.spec.podMetricsEndpoints, [{ port: 'metrics', path: '/metrics' }]);
  });

  it('sets only BROKER_* variables the agent knows, with values its configuration loader accepts', () => {
    const broker = resolvedBrokerEnv(container.env);
    for (const name of Object.keys(broker))
      assert.ok(SCHEMA_VARIABLES.has(name), `${name} is not an option in src/config/schema.ts`);
    const config = loadConfig([], broker);
    assert.equal(config.nodeName, 'ip-10-0-1-23.ec2.internal', 'BROKER_NODE_NAME comes from spec.nodeName');
    assert.equal(config.listen, '10.0.1.23:8181', 'the metadata server listens on the node IP (status.hostIP)');
    assert.equal(config.graceWindowMs, undefined, 'unset: each SDK is held as long as it waits, not capped');
    const metadataPort = container.ports.find((port) => port.name === 'metadata')?.containerPort;
    assert.equal(
      `${config.listen.split(':')[0]}:${metadataPort}`,
      config.listen,
      'the declared port is the one the agent listens on',
    );
  });

  it('with the kube2iam-migration component: listens and declares 8183 (kube2iam holds 8181), apart from the admin port, and changes nothing else', () => {
    const migrating = only(render('test/fixtures/kustomize-kube2iam-migration/'), 'DaemonSet', DaemonSet).spec.template
      .spec.containers[0] as z.infer<typeof Container>;
    const config = loadConfig([], resolvedBrokerEnv(migrating.env));
    assert.equal(config.listen, '10.0.1.23:8183');
    assert.equal(
      migrating.ports.find((port) => port.name === 'metadata')?.containerPort,
      8183,
      'the declared (host) port is the one the agent listens on',
    );
    assert.notEqual(config.adminListen.split(':').at(-1), '8183');
    const rest = (env: z.infer<typeof EnvVar>[]) => env.filter((variable) => variable.name !== 'BROKER_LISTEN');
    assert.deepEqual(rest(migrating.env), rest(container.env));
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
    const files = readdirSync(directory, { recursive: true, withFileTypes: true }).filter((entry) => entry.isFile());
    assert.ok(files.length >= 6);
    for (const file of files) {
      const path = join(file.parentPath, file.name);
      for (const [name] of readFileSync(path, 'utf8').matchAll(/\bBROKER_[A-Z0-9_]+/g))
        assert.ok(SCHEMA_VARIABLES.has(name), `${path}: ${name}`);
    }
  });
});

const HttpsProbe = z.object({
  httpGet: z.object({ scheme: z.literal('HTTPS'), port: z.union([z.string(), z.number()]), path: z.string() }),
});
const RestrictedContainer = z.object({
  image: z.string(),
  args: z.array(z.string()),
  env: z.array(EnvVar).default([]),
  securityContext: z.object({
    runAsNonRoot: z.literal(true),
    allowPrivilegeEscalation: z.literal(false),
    readOnlyRootFilesystem: z.literal(true),
    capabilities: z.object({ drop: z.tuple([z.literal('ALL')]) }).strict(),
  }),
  resources: z.object({ limits: z.object({ memory: z.string() }) }),
});
const NonRootPod = z.object({
  serviceAccountName: z.string(),
  securityContext: z.object({
    runAsNonRoot: z.literal(true),
    runAsUser: z.number().int().positive(),
    seccompProfile: z.object({ type: z.literal('RuntimeDefault') }),
  }),
});
const WebhookDeployment = z.object({
  metadata: Metadata,
  spec: z.object({
    replicas: z.number(),
    selector: z.object({ matchLabels: z.record(z.string(), z.string()) }),
    template: z.object({
      metadata: z.object({ labels: z.record(z.string(), z.string()) }),
      spec: NonRootPod.extend({
        automountServiceAccountToken: z.literal(false),
        affinity: z.object({
          podAntiAffinity: z.object({
            preferredDuringSchedulingIgnoredDuringExecution: z
              .array(
                z.object({
                  podAffinityTerm: z.object({
                    topologyKey: z.string(),
                    labelSelector: z.object({ matchLabels: z.record(z.string(), z.string()) }),
                  }),
                }),
              )
              .length(1),
          }),
        }),
        containers: z
          .array(
            RestrictedContainer.extend({
              ports: z.array(z.object({ name: z.string(), containerPort: z.number() })).length(1),
              livenessProbe: HttpsProbe,
              readinessProbe: HttpsProbe,
              volumeMounts: z
                .array(z.object({ name: z.string(), mountPath: z.string(), readOnly: z.literal(true) }))
                .length(1),
            }),
          )
          .length(1),
        volumes: z
          .array(z.object({ name: z.string(), secret: z.object({ secretName: z.string() }).strict() }))
          .length(1),
      }),
    }),
  }),
});

const WebhookEntry = z.object({
  name: z.string(),
  admissionReviewVersions: z.tuple([z.literal('v1')]),
  sideEffects: z.literal('None'),
  failurePolicy: z.enum(['Fail', 'Ignore']),
  reinvocationPolicy: z.literal('IfNeeded'),
  timeoutSeconds: z.number().max(10),
  clientConfig: z
    .object({ service: z.object({ name: z.string(), namespace: z.string(), path: z.string(), port: z.number() }) })
    .strict(),
  rules: z.tuple([
    z.object({
      apiGroups: z.tuple([z.literal('')]),
      apiVersions: z.tuple([z.literal('v1')]),
      operations: z.tuple([z.literal('CREATE')]),
      resources: z.tuple([z.literal('pods')]),
      scope: z.literal('Namespaced'),
    }),
  ]),
  namespaceSelector: z.object({
    matchExpressions: z.array(
      z.object({ key: z.string(), operator: z.enum(['In', 'NotIn']), values: z.array(z.string()) }),
    ),
  }),
  matchConditions: z.array(z.object({ name: z.string(), expression: z.string() })).length(1),
});
const MutatingWebhookConfiguration = z.object({ metadata: Metadata, webhooks: z.array(WebhookEntry).length(2) });
const Service = z.object({
  metadata: Metadata,
  spec: z.object({
    selector: z.record(z.string(), z.string()),
    ports: z.array(z.object({ port: z.number(), targetPort: z.union([z.string(), z.number()]) })).length(1),
  }),
});
const PodDisruptionBudget = z.object({
  spec: z.object({ minAvailable: z.number(), selector: z.object({ matchLabels: z.record(z.string(), z.string()) }) }),
});
const CertsJob = z.object({
  metadata: Metadata,
  spec: z.object({
    ttlSecondsAfterFinished: z.number(),
    template: z.object({ spec: NonRootPod.extend({ containers: z.array(RestrictedContainer).length(1) }) }),
  }),
});
const Role = z.object({ metadata: Metadata, rules: z.array(Rule) });
const Binding = z.object({
  roleRef: z.object({ apiGroup: z.string(), kind: z.string(), name: z.string() }),
  subjects: z.array(z.object({ kind: z.string(), name: z.string(), namespace: z.string() })).length(1),
});

const selects = (selector: Record<string, string>, labels: Record<string, string>) =>
  Object.entries(selector).every(([key, value]) => labels[key] === value);
/** `--name=value` arguments of the webhook-certs Job. */
const flagValues = (args: string[]) =>
  Object.fromEntries(
    args.filter((arg) => arg.startsWith('--')).map((arg) => arg.slice(2).split('=') as [string, string]),
  );

describe('k8s/ webhook (kubectl kustomize)', () => {
  const objects = render();
  const namespace = only(objects, 'Namespace', z.object({ metadata: Metadata })).metadata.name;
  const deployment = only(objects, 'Deployment', WebhookDeployment, 'kube-iam-broker-webhook');
  const pod = deployment.spec.template.spec;
  const container = pod.containers[0]!;
  const config = loadConfig([], resolvedBrokerEnv(container.env));
  const service = only(objects, 'Service', Service, 'kube-iam-broker-webhook');
  const configuration = only(objects, 'MutatingWebhookConfiguration', MutatingWebhookConfiguration);
  const job = only(objects, 'Job', CertsJob, 'kube-iam-broker-webhook-certs');
  const jobFlags = flagValues(job.spec.template.spec.containers[0]!.args);

  it('runs two replicas of `webhook` apart from each other, as non-root on a read-only root filesystem, under a disruption budget', () => {
    assert.equal(deployment.spec.replicas, 2);
    assert.deepEqual(container.args, ['webhook']);
    assert.equal(container.image, `registry.invalid/kube-iam-broker:${version}`);
    const labels = deployment.spec.template.metadata.labels;
    assert.ok(selects(deployment.spec.selector.matchLabels, labels));
    const term = pod.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]!.podAffinityTerm;
    assert.equal(term.topologyKey, 'kubernetes.io/hostname');
    assert.ok(selects(term.labelSelector.matchLabels, labels), 'the anti-affinity is against its own replicas');
    const budget = only(objects, 'PodDisruptionBudget', PodDisruptionBudget);
    assert.equal(budget.spec.minAvailable, 1);
    assert.ok(selects(budget.spec.selector.matchLabels, labels));
    const agentSelector = only(
      objects,
      'DaemonSet',
      z.object({ spec: z.object({ selector: z.object({ matchLabels: z.record(z.string(), z.string()) }) }) }),
    ).spec.selector.matchLabels;
    assert.ok(!selects(agentSelector, labels), "the DaemonSet does not select the webhook's pods");
  });

  it('sets only BROKER_* options the configuration loader accepts, and serves the mounted Secret on the declared port', () => {
    for (const name of Object.keys(resolvedBrokerEnv(container.env))) assert.ok(SCHEMA_VARIABLES.has(name), name);
    const port = Number(config.webhookListen.split(':').at(-1));
    assert.equal(container.ports[0]!.containerPort, port);
    for (const probe of [container.livenessProbe, container.readinessProbe])
      assert.ok(probe.httpGet.port === container.ports[0]!.name || probe.httpGet.port === port);
    assert.equal(container.livenessProbe.httpGet.path, '/healthz');
    assert.equal(container.readinessProbe.httpGet.path, '/readyz');
    const mount = container.volumeMounts[0]!;
    assert.equal(config.webhookTlsCert, `${mount.mountPath}/tls.crt`);
    assert.equal(config.webhookTlsKey, `${mount.mountPath}/tls.key`);
    assert.equal(pod.volumes[0]!.name, mount.name);
    assert.equal(pod.volumes[0]!.secret.secretName, jobFlags.secret, 'the Secret the Job writes');
  });

  it('writes into pods the address and audience the agent serves', () => {
    const agent = loadConfig(
      [],
      resolvedBrokerEnv(only(objects, 'DaemonSet', DaemonSet).spec.template.spec.containers[0]!.env),
    );
    assert.equal(config.containerListen, agent.containerListen);
    assert.equal(config.tokenAudience, agent.tokenAudience);
    assert.deepEqual(wiringSettings(config), {
      credentialsUri: 'http://169.254.170.23/v1/credentials',
      credentialsHost: '169.254.170.23',
      audience: 'kube-iam-broker',
      expirationSeconds: 3600,
    });
  });

  it('sends pod CREATEs to the Service on paths the webhook serves, failing closed only for pods that asked', () => {
    const servicePort = service.spec.ports[0]!;
    assert.ok(selects(service.spec.selector, deployment.spec.template.metadata.labels));
    assert.equal(servicePort.targetPort, container.ports[0]!.name);
    const [byNamespace, byAnnotation] = configuration.webhooks as [
      z.infer<typeof WebhookEntry>,
      z.infer<typeof WebhookEntry>,
    ];
    for (const webhook of configuration.webhooks) {
      assert.deepEqual(
        { ...webhook.clientConfig.service, path: undefined },
        { name: service.metadata.name, namespace, port: servicePort.port, path: undefined },
      );
      assert.ok(WEBHOOK_PATHS.includes(webhook.clientConfig.service.path), webhook.clientConfig.service.path);
      assert.equal(webhook.failurePolicy, 'Fail', 'a pod that asked is never created silently without credentials');
      assert.ok(
        webhook.namespaceSelector.matchExpressions.some(
          (e) =>
            e.key === 'kubernetes.io/metadata.name' &&
            e.operator === 'NotIn' &&
            e.values.includes(namespace) &&
            e.values.includes('kube-system'),
        ),
        'never its own namespace nor kube-system',
      );
    }
    assert.equal(byNamespace.clientConfig.service.path, '/mutate');
    assert.deepEqual(byNamespace.namespaceSelector.matchExpressions[0], {
      key: 'kube-iam-broker.io/inject',
      operator: 'In',
      values: ['enabled'],
    });
    assert.match(byNamespace.matchConditions[0]!.expression, /\['kube-iam-broker\.io\/inject'\] != 'false'/);
    assert.equal(byAnnotation.clientConfig.service.path, '/mutate/annotated');
    assert.deepEqual(byAnnotation.namespaceSelector.matchExpressions[0], {
      key: 'kube-iam-broker.io/inject',
      operator: 'NotIn',
      values: ['enabled'],
    });
    assert.match(byAnnotation.matchConditions[0]!.expression, /\['kube-iam-broker\.io\/inject'\] == 'true'/);
  });

  it('bootstraps certificates with a Job whose arguments name these objects and whose RBAC allows exactly that', () => {
    const jobPod = job.spec.template.spec;
    assert.deepEqual(jobPod.containers[0]!.args[0], 'webhook-certs');
    assert.deepEqual(jobFlags, {
      service: service.metadata.name,
      secret: pod.volumes[0]!.secret.secretName,
      'ca-secret': 'kube-iam-broker-webhook-ca',
      'webhook-configuration': configuration.metadata.name,
    });
    const account = jobPod.serviceAccountName;
    const role = only(objects, 'Role', Role, account);
    assert.deepEqual(
      grants(role.rules),
      [
        'core/secrets:create',
        `core/secrets/${jobFlags['ca-secret']}:get`,
        `core/secrets/${jobFlags['ca-secret']}:update`,
        `core/secrets/${jobFlags.secret}:get`,
        `core/secrets/${jobFlags.secret}:update`,
      ].sort(),
    );
    const clusterRole = only(objects, 'ClusterRole', ClusterRole, account);
    assert.deepEqual(grants(clusterRole.rules), [
      `admissionregistration.k8s.io/mutatingwebhookconfigurations/${configuration.metadata.name}:get`,
      `admissionregistration.k8s.io/mutatingwebhookconfigurations/${configuration.metadata.name}:patch`,
    ]);
    for (const [kind, roleKind] of [
      ['RoleBinding', 'Role'],
      ['ClusterRoleBinding', 'ClusterRole'],
    ] as const) {
      const binding = only(objects, kind, Binding, account);
      assert.deepEqual(binding.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: roleKind, name: account });
      assert.deepEqual(binding.subjects[0], { kind: 'ServiceAccount', name: account, namespace });
    }
    assert.ok(job.spec.ttlSecondsAfterFinished > 0, 'the finished Job goes, so the next apply renews what is due');
    // The webhook itself reads nothing from the API server.
    assert.ok(
      !objects.some(
        (object) =>
          object.kind.endsWith('Binding') && JSON.stringify(object).includes(`"name":"${pod.serviceAccountName}"`),
      ),
    );
  });

  it('with the cert-manager component: a Certificate for the Service writes the same Secret, the CA is injected, and no Job or its RBAC remain', () => {
    const withCertManager = render('test/fixtures/kustomize-cert-manager/');
    assert.ok(!withCertManager.some((object) => object.metadata.name === 'kube-iam-broker-webhook-certs'));
    const certificate = only(
      withCertManager,
      'Certificate',
      z.object({
        metadata: Metadata,
        spec: z.object({
          secretName: z.string(),
          dnsNames: z.array(z.string()),
          issuerRef: z.object({ kind: z.string(), name: z.string() }),
        }),
      }),
    );
    assert.equal(certificate.spec.secretName, pod.volumes[0]!.secret.secretName);
    assert.ok(certificate.spec.dnsNames.includes(`${service.metadata.name}.${namespace}.svc`));
    assert.equal(
      only(withCertManager, certificate.spec.issuerRef.kind, z.object({ metadata: Metadata })).metadata.name,
      certificate.spec.issuerRef.name,
    );
    const injected = only(
      withCertManager,
      'MutatingWebhookConfiguration',
      z.object({ metadata: z.object({ annotations: z.record(z.string(), z.string()) }) }),
    );
    assert.equal(
      injected.metadata.annotations['cert-manager.io/inject-ca-from'],
      `${namespace}/${certificate.metadata.name}`,
    );
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
        tolerations: z.array(
          z.object({ operator: z.string(), key: z.string().optional(), effect: z.string().optional() }),
        ),
        initContainers: z
          .array(
            z.object({
              image: z.string(),
              args: z.array(z.string()),
              securityContext: z.object({
                allowPrivilegeEscalation: z.literal(false),
                capabilities: z.object({ add: z.array(z.string()), drop: z.array(z.string()) }),
              }),
              volumeMounts: z.array(z.object({ name: z.string(), mountPath: z.string() })),
            }),
          )
          .length(1),
        containers: z
          .array(
            z.object({
              image: z.string(),
              args: z.array(z.string()).optional(),
              command: z.array(z.string()).optional(),
            }),
          )
          .length(1),
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

  it("is one DaemonSet, in the agent's namespace, that needs nothing from the API server", () => {
    assert.deepEqual(
      objects.map((object) => object.kind),
      ['DaemonSet'],
    );
    assert.equal(cleanup.metadata.namespace, agent.metadata.namespace);
    assert.notEqual(cleanup.metadata.name, agent.metadata.name, 'it does not replace the agent');
  });

  it("runs `node-cleanup` from the agent's image of this version, on every node the agent ran on, as the agent reaches the node", () => {
    assert.deepEqual(init?.args, ['node-cleanup']);
    assert.equal(init?.image, `kube-iam-broker:${version}`);
    assert.ok(
      pod.tolerations.some(
        (toleration) =>
          toleration.operator === 'Exists' && toleration.key === undefined && toleration.effect === undefined,
      ),
      'tolerates every taint',
    );
    assert.deepEqual(init?.securityContext.capabilities, { add: ['NET_ADMIN'], drop: ['ALL'] });
    const volumes = (daemonSet: unknown) =>
      z
        .object({
          spec: z.object({
            template: z.object({
              spec: z.object({
                volumes: z.array(z.object({ name: z.string(), hostPath: z.object({ path: z.string() }).optional() })),
              }),
            }),
          }),
        })
        .parse(daemonSet).spec.template.spec.volumes;
    const xtablesLock = (daemonSet: unknown) =>
      volumes(daemonSet).find((volume) => volume.hostPath?.path === '/run/xtables.lock');
    const lock = xtablesLock(objects[0]);
    assert.ok(
      xtablesLock(render().find((object) => object.kind === 'DaemonSet')) && lock,
      "both mount the node's xtables lock",
    );
    assert.ok(
      init?.volumeMounts.some((mount) => mount.name === lock?.name && mount.mountPath === '/run/xtables.lock'),
      'where iptables takes it, serialised with kube-proxy',
    );
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
