/**
 * `kube-iam-broker webhook-certs`: the webhook's certificates without cert-manager. In the cluster
 * (the one-shot Job in k8s/webhook-certs.yaml) it keeps a CA in one Secret, a serving certificate
 * in another (the one the webhook mounts), and the CA in the MutatingWebhookConfiguration's
 * caBundle. Run again, it keeps what is still good and renews what is near its end; a renewed CA
 * stays beside the old one in the caBundle until the old one expires, so no pod creation fails in
 * between. With --out DIR it writes the same files into a directory instead.
 */
import { X509Certificate } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import {
  AdmissionregistrationV1Api,
  ApiException,
  CoreV1Api,
  KubeConfig,
  PatchStrategy,
  type V1Secret,
  setHeaderOptions,
} from '@kubernetes/client-node';
import { z } from 'zod';
import { ConfigError } from '../config/load.js';
import { daysLeft, makeCa, makeServingCertificate } from './certificates.js';

const USAGE = `Usage: kube-iam-broker webhook-certs [--namespace NS] [--service NAME] [--secret NAME] [--ca-secret NAME] [--webhook-configuration NAME] [--valid-days N]
       kube-iam-broker webhook-certs --out DIR [--dns-name NAME ...] [--valid-days N]

  In the cluster: keeps the CA in --ca-secret, the serving certificate for the Service's DNS names in
  --secret (tls.crt, tls.key, ca.crt), and the CA in every webhook's caBundle of --webhook-configuration.
  Renews the serving certificate in its last third, the CA in its last year.
  --out DIR: writes ca.crt, ca.key, tls.crt, tls.key for the --dns-name names instead.`;

const Arguments = z.object({
  namespace: z
    .string()
    .regex(/^[a-z0-9-]{1,63}$/)
    .optional(),
  service: z
    .string()
    .regex(/^[a-z0-9-]{1,63}$/)
    .default('kube-iam-broker-webhook'),
  secret: z.string().min(1).default('kube-iam-broker-webhook-tls'),
  'ca-secret': z.string().min(1).default('kube-iam-broker-webhook-ca'),
  'webhook-configuration': z.string().min(1).default('kube-iam-broker'),
  'valid-days': z.string().regex(/^\d+$/).transform(Number).pipe(z.number().int().min(7).max(3650)).default(365),
  out: z.string().min(1).optional(),
  'dns-name': z.array(z.string().regex(/^[A-Za-z0-9.-]{1,253}$/)).default([]),
});

const CA_VALID_DAYS = 3650;
const CA_RENEW_DAYS = 365;
const CA_COMMON_NAME = 'kube-iam-broker webhook CA';
const SERVICE_ACCOUNT_NAMESPACE = '/var/run/secrets/kubernetes.io/serviceaccount/namespace';

export interface CertificateSet {
  readonly ca: { readonly certificatePem: string; readonly privateKeyPem: string };
  readonly serving: { readonly certificatePem: string; readonly privateKeyPem: string };
  /** The PEM bundle clients trust: the CA, and a previous CA while it is still valid. */
  readonly caBundle: string;
}

/** Keeps what is still good of an existing set and makes what is missing or near its end. */
export function renewCertificates(
  existing: Partial<CertificateSet> | undefined,
  dnsNames: readonly string[],
  validDays: number,
  now = new Date(),
): CertificateSet & { renewed: string[] } {
  const renewed: string[] = [];
  let ca = existing?.ca;
  const previous = ca;
  if (!ca || daysLeft(ca.certificatePem, now) < Math.max(CA_RENEW_DAYS, validDays)) {
    ca = makeCa(CA_COMMON_NAME, CA_VALID_DAYS, now);
    renewed.push('ca');
  }
  let serving = existing?.serving;
  if (
    !serving ||
    renewed.includes('ca') ||
    !servingStillGood(serving.certificatePem, ca.certificatePem, dnsNames, validDays, now)
  ) {
    serving = makeServingCertificate(ca, dnsNames, validDays, now);
    renewed.push('serving');
  }
  const keepPrevious = previous && previous !== ca && daysLeft(previous.certificatePem, now) > 0;
  return {
    ca,
    serving,
    caBundle: keepPrevious ? `${ca.certificatePem}${previous.certificatePem}` : ca.certificatePem,
    renewed,
  };
}

function servingStillGood(
  certificatePem: string,
  caPem: string,
  dnsNames: readonly string[],
  validDays: number,
  now: Date,
): boolean {
  const certificate = new X509Certificate(certificatePem);
  const ca = new X509Certificate(caPem);
  const names = new Set((certificate.subjectAltName ?? '').split(', ').map((entry) => entry.replace(/^DNS:/, '')));
  return (
    certificate.checkIssued(ca) &&
    certificate.verify(ca.publicKey) &&
    dnsNames.every((name) => names.has(name)) &&
    daysLeft(certificatePem, now) > validDays / 3
  );
}

/** The names the API server may call the Service by. */
export const serviceDnsNames = (service: string, namespace: string): string[] => [
  `${service}.${namespace}.svc`,
  `${service}.${namespace}.svc.cluster.local`,
  `${service}.${namespace}`,
  service,
];

export async function runWebhookCertsCommand(
  argv: readonly string[],
  out: NodeJS.WritableStream = process.stdout,
): Promise<void> {
  let values;
  try {
    values = parseArgs({
      args: [...argv],
      options: {
        namespace: { type: 'string' },
        service: { type: 'string' },
        secret: { type: 'string' },
        'ca-secret': { type: 'string' },
        'webhook-configuration': { type: 'string' },
        'valid-days': { type: 'string' },
        out: { type: 'string' },
        'dns-name': { type: 'string', multiple: true },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    }).values;
  } catch (error) {
    throw new ConfigError([`${(error as Error).message}\n${USAGE}`]);
  }
  if (values.help) return void out.write(`${USAGE}\n`);
  const parsed = Arguments.safeParse(values);
  if (!parsed.success)
    throw new ConfigError(parsed.error.issues.map((issue) => `--${issue.path.join('.')}: ${issue.message}`));
  const args = parsed.data;
  if (args.out !== undefined) {
    if (args['dns-name'].length === 0) throw new ConfigError(['--out needs at least one --dns-name']);
    const set = renewCertificates(undefined, args['dns-name'], args['valid-days']);
    mkdirSync(args.out, { recursive: true });
    writeFileSync(join(args.out, 'ca.crt'), set.caBundle);
    writeFileSync(join(args.out, 'ca.key'), set.ca.privateKeyPem, { mode: 0o600 });
    writeFileSync(join(args.out, 'tls.crt'), set.serving.certificatePem);
    writeFileSync(join(args.out, 'tls.key'), set.serving.privateKeyPem, { mode: 0o600 });
    return void out.write(`wrote ca.crt, ca.key, tls.crt, tls.key to ${args.out}\n`);
  }
  const namespace = args.namespace ?? readFileSync(SERVICE_ACCOUNT_NAMESPACE, 'utf8').trim();
  await bootstrapInCluster({ ...args, namespace }, out);
}

async function bootstrapInCluster(
  args: z.output<typeof Arguments> & { namespace: string },
  out: NodeJS.WritableStream,
): Promise<void> {
  const kubeConfig = new KubeConfig();
  kubeConfig.loadFromDefault();
  const core = kubeConfig.makeApiClient(CoreV1Api);
  const admission = kubeConfig.makeApiClient(AdmissionregistrationV1Api);
  const read = (name: string) =>
    core
      .readNamespacedSecret({ name, namespace: args.namespace })
      .catch((error: unknown) =>
        error instanceof ApiException && error.code === 404 ? undefined : Promise.reject(error),
      );
  const [caSecret, tlsSecret] = await Promise.all([read(args['ca-secret']), read(args.secret)]);
  const field = (secret: V1Secret | undefined, key: string) =>
    secret?.data?.[key] ? Buffer.from(secret.data[key], 'base64').toString('utf8') : undefined;
  const pair = (certificatePem: string | undefined, privateKeyPem: string | undefined) =>
    certificatePem && privateKeyPem ? { certificatePem, privateKeyPem } : undefined;
  const set = renewCertificates(
    {
      ca: pair(field(caSecret, 'tls.crt'), field(caSecret, 'tls.key')),
      serving: pair(field(tlsSecret, 'tls.crt'), field(tlsSecret, 'tls.key')),
    },
    serviceDnsNames(args.service, args.namespace),
    args['valid-days'],
  );
  const previousBundle = field(tlsSecret, 'ca.crt');
  const write = async (name: string, existing: V1Secret | undefined, data: Record<string, string>) => {
    const body: V1Secret = {
      metadata: {
        name,
        namespace: args.namespace,
        labels: { 'app.kubernetes.io/name': 'kube-iam-broker', 'app.kubernetes.io/component': 'webhook' },
        resourceVersion: existing?.metadata?.resourceVersion,
      },
      type: 'kubernetes.io/tls',
      data: Object.fromEntries(
        Object.entries(data).map(([key, value]) => [key, Buffer.from(value).toString('base64')]),
      ),
    };
    // A replace carries the resourceVersion read above: a concurrent run makes this one fail, not both write.
    await (existing
      ? core.replaceNamespacedSecret({ name, namespace: args.namespace, body })
      : core.createNamespacedSecret({ namespace: args.namespace, body }));
  };
  if (set.renewed.includes('ca'))
    await write(args['ca-secret'], caSecret, { 'tls.crt': set.ca.certificatePem, 'tls.key': set.ca.privateKeyPem });
  if (set.renewed.length > 0 || previousBundle !== set.caBundle) {
    await write(args.secret, tlsSecret, {
      'tls.crt': set.serving.certificatePem,
      'tls.key': set.serving.privateKeyPem,
      'ca.crt': set.caBundle,
    });
  }
  const configuration = await admission.readMutatingWebhookConfiguration({ name: args['webhook-configuration'] });
  const caBundle = Buffer.from(set.caBundle).toString('base64');
  const patch = (configuration.webhooks ?? []).flatMap((webhook, index) =>
    webhook.clientConfig.caBundle === caBundle
      ? []
      : [
          { op: 'test', path: `/webhooks/${index}/name`, value: webhook.name },
          { op: 'add', path: `/webhooks/${index}/clientConfig/caBundle`, value: caBundle },
        ],
  );
  if (patch.length > 0) {
    await admission.patchMutatingWebhookConfiguration(
      { name: args['webhook-configuration'], body: patch },
      setHeaderOptions('Content-Type', PatchStrategy.JsonPatch),
    );
  }
  const notAfter = new X509Certificate(set.serving.certificatePem).validTo;
  out.write(
    `${JSON.stringify({ renewed: set.renewed, secret: `${args.namespace}/${args.secret}`, caBundlePatched: patch.length / 2, servingNotAfter: notAfter })}\n`,
  );
}
