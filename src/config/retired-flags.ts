/**
 * kube2iam 0.15 and kiam agent flags with no counterpart here, each with the reason. Their
 * arguments keep working: a harmless flag is logged as a warning, and a flag whose effect the
 * agent cannot give is refused (`refuse`) rather than silently dropped.
 */
import type { Peer } from './schema.js';

export interface RetiredFlag {
  readonly flag: string;
  readonly from: Peer;
  /** A switch (no value unless `=value`); otherwise the next argument is its value. */
  readonly isSwitch: boolean;
  readonly why: string;
  /** Values whose effect the agent cannot give: refused with `why` instead of warned. */
  readonly refuse?: (value: string) => boolean;
}

const isOn = (value: string): boolean => value === 'true' || value === '1';
const PUSH_NOT_BACKOFF =
  "an unknown caller waits for its pod's informer event, not a polling backoff, bounded by BROKER_GRACE_WINDOW_MS";
const JSON_LOGS = 'logs are always JSON lines';
const PROMETHEUS_ONLY = 'metrics are served to Prometheus only (BROKER_METRICS_LISTEN)';
const NO_KIAM_SERVER = "there is no kiam server: the agent calls STS itself with the node's credentials";

export const retiredFlags: readonly RetiredFlag[] = [
  {
    flag: '--debug',
    from: 'kube2iam',
    isSwitch: true,
    why: "the pod index is always at /debug/pods on the admin port (kube2iam's /debug/store)",
  },
  {
    flag: '--auto-discover-base-arn',
    from: 'kube2iam',
    isSwitch: true,
    why: 'the base ARN is always discovered from the node when BROKER_BASE_ROLE_ARN is unset',
  },
  {
    flag: '--auto-discover-default-role',
    from: 'kube2iam',
    isSwitch: true,
    why: "the node's own role is never handed to pods; name a default role with BROKER_DEFAULT_ROLE (--default-role)",
    refuse: isOn,
  },
  {
    flag: '--iam-role-error-ttl',
    from: 'kube2iam',
    isSwitch: false,
    why: 'STS errors are not cached; failed calls are retried with backoff under BROKER_STS_QPS',
  },
  {
    flag: '--cache-resync-period',
    from: 'kube2iam',
    isSwitch: false,
    why: 'the informers relist after a failed watch; a periodic resync adds nothing to a push-based index',
  },
  {
    flag: '--resolve-duplicate-cache-ips',
    from: 'kube2iam',
    isSwitch: true,
    why: 'hostNetwork pods are never indexed and an IP belongs to the newest running pod: no duplicates to resolve',
  },
  { flag: '--backoff-max-interval', from: 'kube2iam', isSwitch: false, why: PUSH_NOT_BACKOFF },
  { flag: '--backoff-max-elapsed-time', from: 'kube2iam', isSwitch: false, why: PUSH_NOT_BACKOFF },
  { flag: '--log-format', from: 'kube2iam', isSwitch: false, why: JSON_LOGS },
  {
    flag: '--use-regional-sts-endpoint',
    from: 'kube2iam',
    isSwitch: true,
    why: "the AWS SDK for JavaScript v3 always calls STS in the node's region",
  },
  {
    flag: '--api-server',
    from: 'kube2iam',
    isSwitch: false,
    why: 'the API server comes from a kubeconfig (BROKER_KUBECONFIG, --kubeconfig) or the in-cluster service account',
    refuse: () => true,
  },
  {
    flag: '--api-token',
    from: 'kube2iam',
    isSwitch: false,
    why: 'put the token in a kubeconfig (BROKER_KUBECONFIG, --kubeconfig) or use the in-cluster service account',
    refuse: () => true,
  },
  {
    flag: '--insecure',
    from: 'kube2iam',
    isSwitch: true,
    why: 'set insecure-skip-tls-verify in the kubeconfig instead (testing only)',
    refuse: isOn,
  },
  { flag: '--json-log', from: 'kiam', isSwitch: true, why: JSON_LOGS },
  { flag: '--prometheus-sync-interval', from: 'kiam', isSwitch: false, why: 'metrics are computed when scraped' },
  { flag: '--statsd', from: 'kiam', isSwitch: false, why: PROMETHEUS_ONLY },
  { flag: '--statsd-prefix', from: 'kiam', isSwitch: false, why: PROMETHEUS_ONLY },
  { flag: '--statsd-interval', from: 'kiam', isSwitch: false, why: PROMETHEUS_ONLY },
  { flag: '--server-address', from: 'kiam', isSwitch: false, why: NO_KIAM_SERVER },
  { flag: '--server-address-refresh', from: 'kiam', isSwitch: false, why: NO_KIAM_SERVER },
  { flag: '--cert', from: 'kiam', isSwitch: false, why: NO_KIAM_SERVER },
  { flag: '--key', from: 'kiam', isSwitch: false, why: NO_KIAM_SERVER },
  { flag: '--ca', from: 'kiam', isSwitch: false, why: NO_KIAM_SERVER },
  { flag: '--gateway-timeout-creation', from: 'kiam', isSwitch: false, why: NO_KIAM_SERVER },
];
