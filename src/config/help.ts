/** --help text, generated from the option list so it can never drift from what is accepted. */
import { flagOf, optionEntries, usedByText } from './schema.js';

export function helpText(version: string): string {
  const lines = [
    `kube-iam-broker ${version}: gives each pod the IAM role it is annotated with, over the EC2 metadata API.`,
    '',
    'Usage: kube-iam-broker [options]           run the agent',
    "       kube-iam-broker events [--follow]   tail a running agent's credential events",
    '       kube-iam-broker demo                run the agent against an embedded cluster and STS',
    '       kube-iam-broker node-cleanup        remove every rule and guard the agent installed on this node (uninstall)',
    '       kube-iam-broker webhook             run the admission webhook that wires pods to the container-credentials door',
    "       kube-iam-broker webhook-certs       make the webhook's CA and serving certificate (Secret + caBundle, or --out DIR)",
    '',
    'Every option is an environment variable and a flag (the flag wins):',
    '',
  ];
  for (const [, spec] of optionEntries()) {
    const aliases = (spec.aliases ?? []).map((alias) => `${alias.flag} (${alias.from})`).join(', ');
    lines.push(
      `  ${flagOf(spec)}  ${spec.env}  [${spec.kind}${spec.default !== undefined ? `, default ${spec.default}` : ', unset by default'}]`,
    );
    lines.push(`      ${spec.description}${usedByText(spec)}`);
    if (aliases) lines.push(`      also accepted: ${aliases}`);
  }
  lines.push(
    '',
    'Kubernetes access: KUBECONFIG when set, else the in-cluster service account.',
    "AWS: the SDK's default credential chain and settings (AWS_REGION, AWS_ENDPOINT_URL_STS, ...).",
  );
  return lines.join('\n');
}
