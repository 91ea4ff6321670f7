/**
 * The node readiness taint: nodes register with it (kubelet --register-with-taints), pods that
 * need credentials do not tolerate it, and the agent removes it from its own node once it can
 * serve them. The agent only ever reads and patches the node named by BROKER_NODE_NAME.
 */
import { z } from 'zod';
import { KubeApiError, type KubeConnection, kubeRequest } from '../cluster/kube-connection.js';

const TAINT_EFFECTS = ['NoSchedule', 'PreferNoSchedule', 'NoExecute'] as const;
/** A Kubernetes qualified name: an optional DNS-subdomain prefix and a name of up to 63 characters. */
const QUALIFIED_NAME =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const LABEL_VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/;

export interface TaintSpec {
  readonly key: string;
  readonly value?: string;
  readonly effect: (typeof TAINT_EFFECTS)[number];
}

/** `key[=value]:effect`, as kubectl taint writes it, e.g. kube-iam-broker/not-ready:NoSchedule. */
export const TaintText = z
  .string()
  .transform((text, ctx) => {
    const match = /^([^=:]+)(?:=([^:]*))?:([^:]+)$/.exec(text.trim());
    if (!match) {
      ctx.addIssue({
        code: 'custom',
        message: `expected key[=value]:effect such as kube-iam-broker/not-ready:NoSchedule, got "${text}"`,
      });
      return z.NEVER;
    }
    return {
      key: match[1] as string,
      effect: match[3] as string,
      ...(match[2] !== undefined ? { value: match[2] } : {}),
    };
  })
  .pipe(
    z.object({
      key: z.string().regex(QUALIFIED_NAME, 'the taint key must be a qualified name such as kube-iam-broker/not-ready'),
      value: z
        .string()
        .regex(LABEL_VALUE, 'the taint value must be a label value (63 characters of [A-Za-z0-9_.-])')
        .optional(),
      effect: z.enum(TAINT_EFFECTS),
    }),
  )
  .transform((taint): TaintSpec => (taint.value === undefined ? { key: taint.key, effect: taint.effect } : taint));

export const formatTaint = (taint: TaintSpec): string =>
  `${taint.key}${taint.value !== undefined ? `=${taint.value}` : ''}:${taint.effect}`;

/** Re-reads and retries when the node's taints changed between the read and the patch. */
export const MAX_TAINT_CONFLICTS = 5;

export type TaintOutcome = 'removed' | 'absent';

/**
 * Removes the taint (matched by key and effect, as Kubernetes identifies taints) from the node.
 * The JSON patch removes one list element by index and first tests that the element at that
 * index is still this taint: a taint added or removed by someone else in the meantime makes
 * the server refuse the patch (422) instead of the agent deleting the wrong one, and the agent
 * reads the node again. Nothing else on the node is written.
 */
const NodeTaints = z.object({
  spec: z.object({ taints: z.array(z.object({ key: z.string(), effect: z.string() })).nullish() }).nullish(),
});
type NodeTaints = z.infer<typeof NodeTaints>;

/** The two node requests the taint removal makes. */
export interface NodeApi {
  read(name: string): Promise<NodeTaints>;
  /** Applies a JSON patch (RFC 6902); rejects with KubeApiError when the server refuses it. */
  patch(name: string, operations: readonly object[]): Promise<unknown>;
}

export function nodeApi(kube: KubeConnection): NodeApi {
  const path = (name: string) => `/api/v1/nodes/${encodeURIComponent(name)}`;
  return {
    read: async (name) => NodeTaints.parse(await kubeRequest(kube, path(name))),
    patch: (name, operations) =>
      kubeRequest(kube, path(name), { method: 'PATCH', body: operations, contentType: 'application/json-patch+json' }),
  };
}

export async function removeNodeTaint(api: NodeApi, nodeName: string, taint: TaintSpec): Promise<TaintOutcome> {
  for (let attempt = 1; ; attempt++) {
    const node = await api.read(nodeName);
    const index = (node.spec?.taints ?? []).findIndex(
      (candidate) => candidate.key === taint.key && candidate.effect === taint.effect,
    );
    if (index < 0) return 'absent';
    const patch = [
      { op: 'test', path: `/spec/taints/${index}/key`, value: taint.key },
      { op: 'test', path: `/spec/taints/${index}/effect`, value: taint.effect },
      { op: 'remove', path: `/spec/taints/${index}` },
    ];
    try {
      await api.patch(nodeName, patch);
      return 'removed';
    } catch (error) {
      const conflict = error instanceof KubeApiError && (error.statusCode === 409 || error.statusCode === 422);
      if (!conflict || attempt >= MAX_TAINT_CONFLICTS) throw error;
    }
  }
}
