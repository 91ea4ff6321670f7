/**
 * The one list of options. Environment variables, command-line flags, `--help`, the README's
 * configuration table and the DaemonSet's env are all derived from (or checked against) this file.
 */
import { z } from 'zod';
import { parseDuration } from './duration.js';
import { TaintText } from '../node/taint.js';

/** How an option's raw text becomes a typed value; each kind knows how to show itself in --help. */
type OptionKind = 'string' | 'integer' | 'boolean' | 'duration' | 'enum' | 'address' | 'url' | 'regex';

export interface OptionSpec<S extends z.ZodType = z.ZodType> {
  /** BROKER_* environment variable; the flag is derived from it. */
  readonly env: string;
  readonly kind: OptionKind;
  readonly schema: S;
  /** Raw default text, parsed by the same schema as user input. Absent: the option is unset by default. */
  readonly default?: string;
  readonly description: string;
  /** Flags of kube2iam or kiam with the same meaning, with a translation when their value differs in form. */
  readonly aliases?: readonly Alias[];
  /** A variable kube2iam, kiam or kubectl users already set (KUBECONFIG, HOST_IP), read when the BROKER_* one is unset. */
  readonly compatEnv?: string;
  /** The default when the command line uses that peer's flags, so its users keep its behaviour. */
  readonly peerDefaults?: Partial<Record<Peer, string>>;
  /** Never logged: the effective-configuration line shows only whether it is set. */
  readonly secret?: true;
  /** The commands that read the option; absent means the agent alone. */
  readonly usedBy?: readonly Command[];
  /** Accepted for one more release only: the warning logged at start when it is set. */
  readonly deprecated?: string;
}

export type Peer = 'kube2iam' | 'kiam';
export type Command = 'agent' | 'webhook';

export interface Alias {
  readonly flag: string;
  readonly from: Peer;
  readonly translate?: (value: string) => string;
  /**
   * A switch (takes no value, or `=true`/`=false`) standing for a value of a non-boolean option,
   * like kube2iam's --verbose for the debug log level; `off` undefined: the switch off changes nothing.
   */
  readonly switch?: { readonly on: string; readonly off?: string };
}

const hostPort = z
  .string()
  .regex(/^(\[[0-9a-fA-F:]+\]|[^:\s]+):\d{1,5}$/, 'expected host:port, e.g. 0.0.0.0:8181')
  .refine((text) => Number(text.slice(text.lastIndexOf(':') + 1)) <= 65_535, 'expected a port from 0 to 65535');
/** kube2iam's --app-port 8181 and kiam's --prometheus-listen-addr :9620 name a port on every address. */
const everyAddress = (port: string): string =>
  port.startsWith(':') ? `0.0.0.0${port}` : /^\d+$/.test(port) ? `0.0.0.0:${port}` : port;
/** kube2iam's --iam-role-session-ttl is how long it caches credentials; it asks STS for twice that. */
const doubledDuration = (ttl: string): string => {
  const seconds = parseDuration(ttl);
  return seconds === undefined ? ttl : `${2 * seconds}s`;
};
/** Go's logrus and kingpin level names that pino spells differently. */
const pinoLevel = (level: string): string =>
  ({ warning: 'warn', panic: 'fatal' })[level.toLowerCase()] ?? level.toLowerCase();
const durationSeconds = (min: number, max: number) =>
  z.string().transform((text, ctx) => {
    const seconds = parseDuration(text);
    if (seconds === undefined || seconds < min || seconds > max) {
      ctx.addIssue({
        code: 'custom',
        message: `expected a duration from ${min}s to ${max}s such as 1h or 45m, got "${text}"`,
      });
      return z.NEVER;
    }
    return seconds;
  });
const integer = (min: number, max: number) =>
  z.string().regex(/^\d+$/, 'expected a whole number').transform(Number).pipe(z.number().int().min(min).max(max));
const boolean = z
  .enum(['true', 'false', '1', '0', 'yes', 'no'])
  .transform((v) => v === 'true' || v === '1' || v === 'yes');
const roleArnPrefix = /^arn:aws[a-z-]*:iam::\d{12}:role\//;
/** A regular expression that must match the whole text (kiam's --allow-route-regexp is anchored the same way). */
const anchoredRegex = z
  .string()
  .refine((source) => {
    try {
      new RegExp(source);
      return true;
    } catch {
      return false;
    }
  }, 'expected a valid regular expression')
  .transform((source) => `^(?:${source})$`);
const annotationKey = z
  .string()
  .regex(/^([a-z0-9.-]+\/)?[A-Za-z0-9._-]+$/, 'expected an annotation key such as iam.amazonaws.com/role');

/** Where the agent's container-credentials door listens; the webhook writes the same address into pods. */
const containerListen = z.union([z.literal('off'), hostPort]);
const filePath = z.string().regex(/^\/\S+$/, 'expected an absolute file path');

const option = <S extends z.ZodType>(spec: OptionSpec<S>): OptionSpec<S> => spec;

export const options = {
  nodeName: option({
    env: 'BROKER_NODE_NAME',
    kind: 'string',
    schema: z.string().min(1).optional(),
    description:
      'Watch only the pods scheduled to this node (fieldSelector spec.nodeName). Set from the downward API in the DaemonSet; unset watches every pod.',
    aliases: [{ flag: '--node', from: 'kube2iam' }],
  }),
  listen: option({
    env: 'BROKER_LISTEN',
    kind: 'address',
    schema: hostPort,
    default: '0.0.0.0:8181',
    description: 'Address of the metadata server that the DNAT rule sends pods to.',
    aliases: [
      { flag: '--app-port', from: 'kube2iam', translate: everyAddress },
      { flag: '--port', from: 'kiam', translate: everyAddress },
    ],
  }),
  adminListen: option({
    env: 'BROKER_ADMIN_LISTEN',
    kind: 'address',
    schema: hostPort,
    default: '127.0.0.1:8182',
    description: 'Address of the admin server (health, readiness). Loopback by default so pods cannot reach it.',
  }),
  metricsListen: option({
    env: 'BROKER_METRICS_LISTEN',
    kind: 'address',
    schema: hostPort,
    default: '0.0.0.0:9181',
    description:
      'Address of the Prometheus /metrics endpoint, and nothing else: no token, because no metric names a pod, a role or a credential. On every address by default so Prometheus can scrape the node.',
    aliases: [
      { flag: '--metrics-port', from: 'kube2iam', translate: everyAddress },
      { flag: '--prometheus-listen-addr', from: 'kiam', translate: everyAddress },
    ],
  }),
  kubeconfig: option({
    env: 'BROKER_KUBECONFIG',
    kind: 'string',
    schema: z.string().min(1).optional(),
    compatEnv: 'KUBECONFIG',
    description:
      "kubeconfig file(s) for the API server, a list separated by : as kubectl reads KUBECONFIG (the first file's current context wins). Unset: KUBECONFIG, else the in-cluster service account.",
    aliases: [{ flag: '--kubeconfig', from: 'kube2iam' }],
  }),
  graceWindowMs: option({
    env: 'BROKER_GRACE_WINDOW_MS',
    kind: 'integer',
    schema: integer(0, 60_000).optional(),
    description:
      'How long a credential request from an IP with no known pod waits for the informer event that brings its pod, when its User-Agent names no SDK the agent knows (unset: 300, inside Go SDK v2\'s 500 ms). Requests from a known SDK wait as long as that SDK allows (see "How long a request waits"); when set, this is also the longest any request waits.',
  }),
  defaultRole: option({
    env: 'BROKER_DEFAULT_ROLE',
    kind: 'string',
    schema: z.string().min(1).optional(),
    description:
      'Role for known pods without a role annotation (unset: those get 404). Never given to a caller whose pod the agent does not know: that caller gets a retryable 503.',
    aliases: [{ flag: '--default-role', from: 'kube2iam' }],
  }),
  deferDefaultRoleForPendingPods: option({
    env: 'BROKER_DEFER_DEFAULT_ROLE_FOR_PENDING_PODS',
    kind: 'boolean',
    schema: boolean.optional(),
    description:
      'Deprecated, no effect, removed in the next release: an unknown caller never gets the default role, so there is nothing left to defer.',
    deprecated:
      'BROKER_DEFER_DEFAULT_ROLE_FOR_PENDING_PODS (--defer-default-role-for-pending-pods) is deprecated and has no effect: a caller whose pod the agent does not know never gets the default role (a retryable 503 instead), whatever its value. Remove it; the next release refuses it.',
  }),
  baseRoleArn: option({
    env: 'BROKER_BASE_ROLE_ARN',
    kind: 'string',
    schema: z
      .string()
      .transform((arn) => (arn.endsWith('/') ? arn : `${arn}/`))
      .pipe(z.string().regex(roleArnPrefix, 'expected a role ARN prefix such as arn:aws:iam::123456789012:role/'))
      .optional(),
    description:
      "Prefix joined to role annotations that are bare names. Unset: discovered from the node's instance profile through the upstream metadata service.",
    aliases: [{ flag: '--base-role-arn', from: 'kube2iam' }],
  }),
  roleAnnotation: option({
    env: 'BROKER_ROLE_ANNOTATION',
    kind: 'string',
    schema: annotationKey,
    default: 'iam.amazonaws.com/role',
    description:
      'Annotation that names the role (a full ARN, or a name joined to the base ARN): on the pod, else on its ServiceAccount, else BROKER_DEFAULT_ROLE applies. For both doors.',
    aliases: [{ flag: '--iam-role-key', from: 'kube2iam' }],
  }),
  externalIdAnnotation: option({
    env: 'BROKER_EXTERNAL_ID_ANNOTATION',
    kind: 'string',
    schema: annotationKey,
    default: 'iam.amazonaws.com/external-id',
    description: 'Pod annotation that carries the STS external ID for the role.',
    aliases: [{ flag: '--iam-external-id', from: 'kube2iam' }],
  }),
  sessionDurationSeconds: option({
    env: 'BROKER_SESSION_DURATION',
    kind: 'duration',
    schema: durationSeconds(900, 43_200),
    default: '1h',
    description: "DurationSeconds asked of STS AssumeRole. The role's maximum session duration must allow it.",
    aliases: [{ flag: '--iam-role-session-ttl', from: 'kube2iam', translate: doubledDuration }],
  }),
  imdsTokens: option({
    env: 'BROKER_IMDS_TOKENS',
    kind: 'enum',
    schema: z.enum(['optional', 'required']),
    default: 'optional',
    description:
      'IMDSv2 session tokens: optional accepts IMDSv1 requests too; required answers 401 without a valid token.',
  }),
  metadataUpstream: option({
    env: 'BROKER_METADATA_UPSTREAM',
    kind: 'url',
    schema: z.url({ protocol: /^https?$/ }).transform((url) => url.replace(/\/+$/, '')),
    default: 'http://169.254.169.254',
    description:
      'The real instance-metadata service, for allow-listed paths and for discovering the account and region.',
    aliases: [{ flag: '--metadata-addr', from: 'kube2iam', translate: (host) => `http://${host}` }],
  }),
  metadataAllow: option({
    env: 'BROKER_METADATA_ALLOW',
    kind: 'regex',
    schema: anchoredRegex,
    default:
      '^/latest/meta-data/(placement/(region|availability-zone|availability-zone-id)|instance-id|instance-type|ami-id|local-hostname|local-ipv4|mac)?$',
    description:
      "Regular expression of the other metadata paths proxied to the upstream, matched against the whole path (anchored at both ends, as kiam does). Never matched against the credential paths, which are always answered by the agent. kiam's flags bring kiam's default, ^$ (proxy nothing).",
    aliases: [
      { flag: '--allow-route-regexp', from: 'kiam' },
      { flag: '--whitelist-route-regexp', from: 'kiam' },
    ],
    // kiam proxies nothing but credentials unless told otherwise.
    peerDefaults: { kiam: '^$' },
  }),
  // Credential supply at scale: STS rate limit, client deadline, cache bound.
  stsQps: option({
    env: 'BROKER_STS_QPS',
    kind: 'integer',
    schema: integer(1, 1_000),
    default: '10',
    description:
      'AssumeRole calls per second this agent makes at most (a token bucket). Requests waiting on a client go before background refreshes.',
  }),
  stsBurst: option({
    env: 'BROKER_STS_BURST',
    kind: 'integer',
    schema: integer(1, 10_000),
    default: '20',
    description: "AssumeRole calls allowed at once above the steady rate (the token bucket's size).",
  }),
  credentialDeadlineMs: option({
    env: 'BROKER_CREDENTIAL_DEADLINE_MS',
    kind: 'integer',
    schema: integer(50, 60_000).optional(),
    description:
      'The longest a credential request is held in all (the wait for its pod plus STS). Then a retryable 503 answers (or still-valid cached credentials when STS fails) while STS is retried in the background. Unset: per SDK, inside its timeout (450 for Go SDK v2, 900 for the SDKs that wait 1 s); for other clients 450, or their wait plus 150 when that is more. When set, it bounds every request, and its wait.',
  }),
  prefetch: option({
    env: 'BROKER_PREFETCH',
    kind: 'enum',
    schema: z.enum(['arrival', 'first-use']),
    default: 'arrival',
    description:
      "When a pod's credentials are first fetched from STS: arrival (as soon as the pod has an IP, so its first request is a cache hit) or first-use (at its first request, one STS call of latency, so pods that never ask cost no AssumeRole). Either way they are then refreshed ahead while the pod lives. See the README for the numbers.",
  }),
  credentialCacheMax: option({
    env: 'BROKER_CREDENTIAL_CACHE_MAX',
    kind: 'integer',
    schema: integer(1, 1_000_000),
    default: '10000',
    description:
      'Identities (role, external ID, session) whose credentials are cached at most; identities no live pod uses are evicted first.',
  }),
  logLevel: option({
    env: 'BROKER_LOG_LEVEL',
    kind: 'enum',
    schema: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace']),
    default: 'info',
    description: 'pino log level. Logs are JSON lines, one per credential decision.',
    aliases: [
      { flag: '--log-level', from: 'kube2iam', translate: pinoLevel },
      { flag: '--verbose', from: 'kube2iam', switch: { on: 'debug' } },
      { flag: '--level', from: 'kiam', translate: pinoLevel },
    ],
  }),
  // A hostile or broken pod cannot starve the others or the agent (SECURITY.md, denial of service).
  callerRate: option({
    env: 'BROKER_CALLER_RATE',
    kind: 'integer',
    schema: integer(1, 1_000_000),
    default: '100',
    description:
      "Metadata requests per second one caller (source IP) may make, sustained; beyond it (and its burst) the agent answers 429 with Retry-After, as EC2's metadata service does when it throttles. An SDK makes two or three requests per credential fetch.",
  }),
  callerBurst: option({
    env: 'BROKER_CALLER_BURST',
    kind: 'integer',
    schema: integer(1, 1_000_000),
    default: '200',
    description: "Metadata requests one caller may make at once above BROKER_CALLER_RATE (its token bucket's size).",
  }),
  callerMaxConnections: option({
    env: 'BROKER_CALLER_MAX_CONNECTIONS',
    kind: 'integer',
    schema: integer(1, 1_000_000),
    default: '128',
    description:
      'Open connections to the metadata port one caller may hold; a connection beyond it is answered 429 and closed.',
  }),
  callerMaxWaiting: option({
    env: 'BROKER_CALLER_MAX_WAITING',
    kind: 'integer',
    schema: integer(1, 1_000_000),
    default: '32',
    description:
      'Credential requests of one caller that may wait for its pod (within the grace window) at once; one more is answered 429 with Retry-After.',
  }),
  maxConnections: option({
    env: 'BROKER_MAX_CONNECTIONS',
    kind: 'integer',
    schema: integer(1, 1_000_000),
    default: '2048',
    description:
      "Open connections to the metadata port in all; beyond it new connections are closed at once. Bounds the agent's memory (about 10 KB per idle connection).",
  }),
  auditCoalesceInterval: option({
    env: 'BROKER_AUDIT_COALESCE_INTERVAL',
    kind: 'duration',
    schema: durationSeconds(1, 3600),
    default: '10s',
    description:
      'Identical refusals (credential.denied, token.refused, request.throttled) of one caller within this interval are one audit event and one log line: the first at once, the repeats as one event with a count at the end of the interval.',
  }),
  // Audit event stream on the admin port (GET /events, `kube-iam-broker events`).
  adminToken: option({
    env: 'BROKER_ADMIN_TOKEN',
    kind: 'string',
    schema: z.string().min(16, 'expected a token of at least 16 characters').optional(),
    secret: true,
    description:
      'Bearer token required for /events and /debug/* on the admin port. Required when BROKER_ADMIN_LISTEN is not a loopback address (the agent refuses to start without it); pass it in the environment, not as a flag.',
  }),
  eventsBuffer: option({
    env: 'BROKER_EVENTS_BUFFER',
    kind: 'integer',
    schema: integer(0, 1_000_000),
    default: '1000',
    description:
      'Recent audit events kept in memory, for subscribers resuming with Last-Event-ID and for `kube-iam-broker events` without --follow.',
  }),
  eventsHeartbeat: option({
    env: 'BROKER_EVENTS_HEARTBEAT',
    kind: 'duration',
    schema: durationSeconds(1, 3600),
    default: '15s',
    description:
      'Interval of the keep-alive comment (SSE) or blank line (NDJSON) sent to idle /events subscribers, so proxies and clients see the connection is alive.',
  }),
  eventsSubscriberBufferBytes: option({
    env: 'BROKER_EVENTS_SUBSCRIBER_BUFFER_BYTES',
    kind: 'integer',
    schema: integer(16_384, 67_108_864),
    default: '1048576',
    description:
      'Bytes queued for one /events subscriber that does not read fast enough; beyond it events are dropped for that subscriber and counted in a stream.gap event, so credential serving never waits on it.',
  }),
  eventsMaxSubscribers: option({
    env: 'BROKER_EVENTS_MAX_SUBSCRIBERS',
    kind: 'integer',
    schema: integer(1, 10_000),
    default: '16',
    description:
      'Followers of /events at once; one more is answered 503 with Retry-After. Each holds at most BROKER_EVENTS_SUBSCRIBER_BUFFER_BYTES of unsent events.',
  }),
  // Namespace restrictions (kube2iam's --namespace-restrictions).
  namespaceRestrictions: option({
    env: 'BROKER_NAMESPACE_RESTRICTIONS',
    kind: 'boolean',
    schema: boolean,
    default: 'false',
    description:
      'Allow a pod only the roles its Namespace lists in BROKER_NAMESPACE_KEY (kube2iam) or permits in BROKER_NAMESPACE_PERMITTED_KEY (kiam); the default role is always allowed, also when a pod names it. A denied request gets 403 and a RoleDenied Event on the pod.',
    aliases: [{ flag: '--namespace-restrictions', from: 'kube2iam' }],
  }),
  namespaceRestrictionFormat: option({
    env: 'BROKER_NAMESPACE_RESTRICTION_FORMAT',
    kind: 'enum',
    schema: z.enum(['glob', 'regexp']),
    default: 'glob',
    description:
      'How the allowed-role patterns are read: glob (`*` matches anything) or regexp. Either way a pattern must match the whole role ARN; a bare name is joined to the base ARN.',
    aliases: [
      { flag: '--namespace-restriction-format', from: 'kube2iam', translate: (format) => format.toLowerCase() },
    ],
  }),
  namespaceKey: option({
    env: 'BROKER_NAMESPACE_KEY',
    kind: 'string',
    schema: annotationKey,
    default: 'iam.amazonaws.com/allowed-roles',
    description:
      'Namespace annotation holding the JSON array of allowed-role patterns, e.g. ["app-*", "arn:aws:iam::123456789012:role/shared"].',
    aliases: [{ flag: '--namespace-key', from: 'kube2iam' }],
  }),
  watchDeadlineSeconds: option({
    env: 'BROKER_WATCH_DEADLINE',
    kind: 'duration',
    schema: durationSeconds(2, 600),
    default: '30s',
    description:
      "The longest the agent trusts a silent watch stream: a stream that died without a reset (a network partition) is noticed within it. Until the informer is watching again, credential requests get a retryable 503 and /readyz 503, so a pod on a reused IP never gets the old pod's role from a stale index. Each watch is one request to the API server per five sixths of this.",
  }),
  namespacePermittedKey: option({
    env: 'BROKER_NAMESPACE_PERMITTED_KEY',
    kind: 'string',
    schema: annotationKey,
    default: 'iam.amazonaws.com/permitted',
    description:
      'Namespace annotation holding one regular expression of the roles its pods may have, as kiam has it; read beside BROKER_NAMESPACE_KEY (either allowing is enough). Matched against the whole role ARN (a bare expression is joined to the base ARN; a leading ^ and trailing $ are implied); empty permits nothing.',
  }),
  // Node integration (src/node/): the DNAT rule, dropping stale metadata connections, the readiness taint.
  iptables: option({
    env: 'BROKER_IPTABLES',
    kind: 'boolean',
    schema: boolean,
    default: 'false',
    description:
      "Install (and keep) the nat PREROUTING rule that sends pods' traffic for the metadata address (the host and port of BROKER_METADATA_UPSTREAM) to the agent, and the filter guard that resets such traffic the rule did not redirect (also for fd00:ec2::254 on nodes with IPv6). Needs hostNetwork and NET_ADMIN.",
    aliases: [{ flag: '--iptables', from: 'kube2iam' }],
  }),
  hostIp: option({
    env: 'BROKER_HOST_IP',
    kind: 'string',
    schema: z.ipv4().optional(),
    description:
      "The node's IP that the DNAT rule sends pods to (status.hostIP from the downward API). Unset: the host of BROKER_LISTEN when it is a specific address.",
    compatEnv: 'HOST_IP',
    aliases: [
      { flag: '--host-ip', from: 'kube2iam' },
      { flag: '--host', from: 'kiam' },
    ],
  }),
  hostInterface: option({
    env: 'BROKER_HOST_INTERFACE',
    kind: 'string',
    schema: z
      .string()
      .regex(
        /^!?[A-Za-z0-9_.@-]{1,15}\+?$/,
        'expected an interface name or prefix such as cali+, eni+, docker0, or !eth0',
      )
      .optional(),
    description:
      "Interfaces pods' traffic arrives on, for the DNAT rule: cali+ (Calico), eni+ (AWS VPC CNI), veth+, or the bridge (docker0, cbr0) for bridge CNIs; a leading ! matches every other interface. Required with BROKER_IPTABLES.",
    aliases: [{ flag: '--host-interface', from: 'kube2iam' }],
  }),
  iptablesBinary: option({
    env: 'BROKER_IPTABLES_BINARY',
    kind: 'string',
    schema: z.string().regex(/^[A-Za-z0-9_./-]+$/, 'expected auto or an iptables binary such as iptables-legacy'),
    default: 'auto',
    description:
      "iptables binary (name or path). auto: the backend (nf_tables or legacy) the node already uses, judged by kubelet's hint chains and the nat rules present.",
  }),
  iptablesCheckIntervalSeconds: option({
    env: 'BROKER_IPTABLES_CHECK_INTERVAL',
    kind: 'duration',
    schema: durationSeconds(1, 3600),
    default: '10s',
    description:
      'How often the DNAT rule is checked and re-installed if something removed it (an iptables flush, a CNI restart).',
  }),
  iptablesRemoveOnExit: option({
    env: 'BROKER_IPTABLES_REMOVE_ON_EXIT',
    kind: 'boolean',
    schema: boolean,
    default: 'false',
    description:
      "Remove the DNAT rule and the guards on SIGTERM/SIGINT. false (the default) keeps them, so while no agent runs (a rolling update, a crash) pods get connection refused, never the node's role; `kube-iam-broker node-cleanup` removes them when uninstalling. true restores the node's metadata service to pods whenever the agent stops.",
    aliases: [
      { flag: '--iptables-remove', from: 'kiam' },
      { flag: '--no-iptables-remove', from: 'kiam', switch: { on: 'false', off: 'true' } },
    ],
  }),
  dropConnections: option({
    env: 'BROKER_DROP_CONNECTIONS',
    kind: 'boolean',
    schema: boolean,
    default: 'true',
    description:
      'Once the DNAT rule is in place, delete the conntrack entries of connections to the metadata address that bypass it, so keep-alive clients that predate the agent reconnect through it.',
  }),
  nodeTaint: option({
    env: 'BROKER_NODE_TAINT',
    kind: 'string',
    schema: TaintText.optional(),
    description:
      'A taint (key[=value]:effect, e.g. kube-iam-broker/not-ready:NoSchedule) removed from this node (BROKER_NODE_NAME) once the DNAT rule is in place and the informers have synced. Needs RBAC patch on nodes.',
  }),
  // The container-credentials door (issue 12) and the admission webhook that wires pods to it.
  containerListen: option({
    env: 'BROKER_CONTAINER_LISTEN',
    kind: 'address',
    schema: containerListen,
    default: '169.254.170.23:80',
    description:
      'Address of the container-credentials endpoint (path /v1/credentials); off disables it. The webhook writes it into pods as AWS_CONTAINER_CREDENTIALS_FULL_URI, so its host must be one the SDKs accept over plain http: 169.254.170.23, 169.254.170.2, fd00:ec2::23 or loopback.',
    usedBy: ['agent', 'webhook'],
  }),
  tokenAudience: option({
    env: 'BROKER_TOKEN_AUDIENCE',
    kind: 'string',
    schema: z.string().regex(/^[A-Za-z0-9._:/-]{1,253}$/, 'expected an audience such as kube-iam-broker'),
    default: 'kube-iam-broker',
    description:
      'Audience of the projected service-account token that proves a pod on the container-credentials door: the webhook asks the kubelet for it, the agent accepts no other.',
    usedBy: ['agent', 'webhook'],
  }),
  containerLink: option({
    env: 'BROKER_CONTAINER_LINK',
    kind: 'string',
    schema: z.union([
      z.literal('off'),
      z.string().regex(/^[A-Za-z0-9_.-]{1,15}$/, 'expected an interface name (at most 15 characters) or off'),
    ]),
    // kube-iam-broker0 would be 16 characters: Linux allows 15.
    default: 'kube-iam-broker',
    description:
      'Dummy link on which the agent brings up the host of BROKER_CONTAINER_LISTEN (an IPv6 host only when the node has IPv6), so that pods reach it by routing; kube-iam-broker node-cleanup removes it. off: the address is managed elsewhere. Needs hostNetwork and NET_ADMIN; a failure is logged, never fatal.',
  }),
  webhookListen: option({
    env: 'BROKER_WEBHOOK_LISTEN',
    kind: 'address',
    schema: hostPort,
    default: '0.0.0.0:8443',
    description: 'HTTPS address of the admission webhook (POST /mutate, /healthz, /readyz, /metrics).',
    usedBy: ['webhook'],
  }),
  webhookTlsCert: option({
    env: 'BROKER_WEBHOOK_TLS_CERT',
    kind: 'string',
    schema: filePath.optional(),
    description:
      'PEM serving certificate (chain) of the webhook. Re-read when the file changes, as when a mounted Secret rotates. Required by `kube-iam-broker webhook`.',
    usedBy: ['webhook'],
  }),
  webhookTlsKey: option({
    env: 'BROKER_WEBHOOK_TLS_KEY',
    kind: 'string',
    schema: filePath.optional(),
    description:
      "PEM private key of the webhook's serving certificate, re-read with it. Required by `kube-iam-broker webhook`.",
    usedBy: ['webhook'],
  }),
  webhookTokenExpiration: option({
    env: 'BROKER_WEBHOOK_TOKEN_EXPIRATION',
    kind: 'duration',
    schema: durationSeconds(600, 86_400),
    default: '1h',
    description:
      'expirationSeconds of the projected token the webhook mounts (the kubelet refreshes it at 80% of its life). A pod may ask for another with the annotation kube-iam-broker.io/token-expiration (seconds, 600 to 86400).',
    usedBy: ['webhook'],
  }),
} as const;

type Options = typeof options;
export type Config = { readonly [K in keyof Options]: z.output<Options[K]['schema']> };
export type OptionName = keyof Options;

/** `BROKER_GRACE_WINDOW_MS` → `--grace-window-ms`. */
export const flagOf = (spec: OptionSpec): string =>
  `--${spec.env
    .replace(/^BROKER_/, '')
    .toLowerCase()
    .replace(/_/g, '-')}`;

export const optionEntries = (): Array<[OptionName, OptionSpec]> =>
  Object.entries(options) as Array<[OptionName, OptionSpec]>;

/** " Used by: agent, webhook." for options other commands read too; nothing for the agent's own. */
export const usedByText = (spec: OptionSpec): string => (spec.usedBy ? ` Used by: ${spec.usedBy.join(', ')}.` : '');
