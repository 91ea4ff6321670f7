/**
 * Prometheus metrics, served alone on BROKER_METRICS_LISTEN (GET /metrics): no metric names a pod,
 * a role or a credential, so the listener needs no token and Prometheus may reach it. Counters and histograms are derived from the
 * streams that already carry the facts (the audit stream, the index's applied events); gauges
 * read the current state when scraped. Nothing here keeps a second record of a decision.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { type Observable, Subscription } from 'rxjs';
import type { AuditEvent } from '../audit/events.js';
import type { AppliedEvent, PodIndex } from '../broker/pod-index.js';
import { credentialRoute } from '../imds/server.js';
import { VERSION } from '../version.js';

export interface MetricsSources {
  readonly events$: Observable<AuditEvent>;
  readonly applied$: Observable<AppliedEvent>;
  readonly index: PodIndex;
  /** Lookups waiting for their pod (keys with waiters). */
  readonly waitingLookups: () => number;
  readonly cacheSize: () => number;
  readonly queuedStsCalls: () => number;
  /** Log lines dropped because stdout was slower than the agent logged (src/log.ts). */
  readonly logLinesDropped?: () => number;
}

export const PREFIX = 'kube_iam_broker_';
/** From a cache hit (sub-millisecond) to the longest an SDK waits (1 s), and past it. */
export const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5];
const RESOURCES = ['pods', 'namespaces', 'serviceaccounts'] as const;
/**
 * prom-client samples event-loop delay with a timer of this resolution (its default, 10 ms, wakes an
 * idle agent 100 times a second: most of its idle CPU). Once a second still shows a stalled loop.
 */
const EVENT_LOOP_SAMPLE_MS = 1_000;

/** The metadata route a request path belongs to, as a bounded label. */
export function routeLabel(path: string): string {
  if (path === '/latest/api/token') return 'token';
  return credentialRoute(path)?.kind ?? 'other';
}

export class BrokerMetrics {
  readonly registry = new Registry();
  private readonly owned = new Subscription();
  private readonly requests: Histogram<'route' | 'status'>;
  private readonly containerRequests: Histogram<'status'>;
  private readonly tokenReviews: Counter<'outcome'>;

  constructor(sources: MetricsSources) {
    const registers = [this.registry];
    // Node's process metrics under their standard names (process_*, nodejs_*), as dashboards expect.
    collectDefaultMetrics({ register: this.registry, eventLoopMonitoringPrecision: EVENT_LOOP_SAMPLE_MS });
    new Gauge({
      name: `${PREFIX}build_info`,
      help: 'Always 1; the labels say which build runs.',
      labelNames: ['version', 'nodejs_version'],
      registers,
    }).set({ version: VERSION, nodejs_version: process.version }, 1);
    this.requests = new Histogram({
      name: `${PREFIX}http_request_duration_seconds`,
      help: 'Metadata requests by route and status, and how long they took.',
      labelNames: ['route', 'status'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.containerRequests = new Histogram({
      name: `${PREFIX}container_request_duration_seconds`,
      help: 'Container-credentials requests by status, and how long they took (a TokenReview included when one was needed).',
      labelNames: ['status'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.tokenReviews = new Counter({
      name: `${PREFIX}token_reviews_total`,
      help: 'Service-account tokens that passed the local check, by how their review ended: cached (no API call), accepted, refused, error (API server unreachable).',
      labelNames: ['outcome'],
      registers,
    });
    for (const outcome of ['cached', 'accepted', 'refused', 'error']) this.tokenReviews.inc({ outcome }, 0);
    const lookupWait = new Histogram({
      name: `${PREFIX}lookup_wait_seconds`,
      help: 'How long credential requests waited for their pod (0 when it was already known).',
      buckets: LATENCY_BUCKETS,
      registers,
    });
    const lookups = new Counter({
      name: `${PREFIX}lookups_waited_total`,
      help: 'Lookups of callers not known at once, by how they ended: push (the pod arrived), retry (refused when the hold ended).',
      labelNames: ['outcome'],
      registers,
    });
    const issued = new Counter({
      name: `${PREFIX}credentials_issued_total`,
      help: 'Credentials handed out, by cache result (hit, miss, stale: STS failing, served below the usual minimum life) and role source.',
      labelNames: ['cache', 'source'],
      registers,
    });
    const denied = new Counter({
      name: `${PREFIX}credentials_denied_total`,
      help: 'Credential requests refused, by HTTP status and a bounded reason (see the README).',
      labelNames: ['status', 'reason'],
      registers,
    });
    const throttled = new Counter({
      name: `${PREFIX}requests_throttled_total`,
      help: 'Metadata requests and connections refused with 429 because their caller was over a per-caller limit (rate, connections, waiting lookups). Repeats are counted when their coalesced audit event is published.',
      labelNames: ['limit'],
      registers,
    });
    for (const limit of ['rate', 'connections', 'waiting']) throttled.inc({ limit }, 0);
    const stsCalls = new Counter({
      name: `${PREFIX}sts_calls_total`,
      help: 'AssumeRole attempts by trigger (client, background) and outcome (success, throttled, error).',
      labelNames: ['trigger', 'outcome'],
      registers,
    });
    const stsLatency = new Histogram({
      name: `${PREFIX}sts_call_duration_seconds`,
      help: 'AssumeRole latency by outcome.',
      labelNames: ['outcome'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    const restarts = new Counter({
      name: `${PREFIX}informer_restarts_total`,
      help: 'Informer watches that failed and were restarted.',
      labelNames: ['resource'],
      registers,
    });
    const relists = new Counter({
      name: `${PREFIX}informer_relists_total`,
      help: 'Completed informer lists (the first sync and every relist).',
      labelNames: ['resource'],
      registers,
    });
    for (const resource of RESOURCES) {
      restarts.inc({ resource }, 0);
      relists.inc({ resource }, 0);
    }
    const { index } = sources;
    new Gauge({
      name: `${PREFIX}informer_synced`,
      help: '1 once the informer has listed everything and is watching.',
      labelNames: ['resource'],
      registers,
      collect() {
        for (const resource of RESOURCES)
          this.set({ resource }, index.health(resource).synced && index.health(resource).watching ? 1 : 0);
      },
    });
    const stateGauge = (name: string, help: string, read: () => number) =>
      new Gauge({
        name: `${PREFIX}${name}`,
        help,
        registers,
        collect() {
          this.set(read());
        },
      });
    stateGauge(
      'pending_lookups',
      'Requests waiting for their pod to appear (keys with waiters).',
      sources.waitingLookups,
    );
    stateGauge('credential_cache_size', 'Identities with cached credentials.', sources.cacheSize);
    stateGauge('sts_queued_calls', 'AssumeRole calls waiting for a rate-limit token.', sources.queuedStsCalls);
    stateGauge('pods_indexed', 'Pods the index holds.', () => index.podCount());
    const dnatPresent = new Gauge({
      name: `${PREFIX}dnat_rule_present`,
      help: "1 while the DNAT rule that sends pods' metadata traffic to the agent is in place (BROKER_IPTABLES); 0 before it is installed and after removal.",
      registers,
    });
    const dnatReinstalls = new Counter({
      name: `${PREFIX}dnat_rule_reinstalls_total`,
      help: 'Times the DNAT rule was found missing (an iptables flush, a CNI restart) and re-installed.',
      registers,
    });
    const conntrackDrops = new Counter({
      name: `${PREFIX}conntrack_entries_dropped_total`,
      help: 'Connection-tracking entries to the metadata address deleted because they bypassed the DNAT rule.',
      registers,
    });
    const { logLinesDropped } = sources;
    if (logLinesDropped) {
      let reported = 0;
      new Counter({
        name: `${PREFIX}log_lines_dropped_total`,
        help: 'Log lines dropped because stdout was slower than the agent logged (the audit stream still carried their events).',
        registers,
        collect() {
          const dropped = logLinesDropped();
          this.inc(dropped - reported);
          reported = dropped;
        },
      });
    }

    this.owned.add(
      sources.events$.subscribe((event) => {
        switch (event.type) {
          case 'credential.issued':
            lookupWait.observe(event.waitedMs / 1000);
            issued.inc({ cache: event.cache ?? 'miss', source: event.source });
            return;
          case 'credential.denied':
            lookupWait.observe(event.waitedMs / 1000);
            denied.inc({ status: String(event.status), reason: event.cause ?? 'other' }, event.count ?? 1);
            return;
          case 'request.throttled':
            throttled.inc({ limit: event.limit }, event.count ?? 1);
            return;
          case 'lookup.waited':
            lookups.inc({ outcome: event.outcome });
            return;
          case 'sts.call':
            stsCalls.inc({ trigger: event.trigger, outcome: event.outcome });
            stsLatency.observe({ outcome: event.outcome }, event.durationMs / 1000);
            return;
          case 'node.iptables':
            dnatPresent.set(event.action === 'removed' ? 0 : 1);
            if (event.action === 'reinstalled') dnatReinstalls.inc();
            return;
          case 'node.conntrack':
            conntrackDrops.inc(event.count);
            return;
          default:
            return;
        }
      }),
    );
    this.owned.add(
      sources.applied$.subscribe(({ event }) => {
        if (event.event.type === 'disconnected') restarts.inc({ resource: event.resource });
        if (event.event.type === 'synced') relists.inc({ resource: event.resource });
      }),
    );
  }

  /** Wraps the metadata handler: every response counted by route and status when it finishes. */
  instrument(
    handler: (req: IncomingMessage, res: ServerResponse) => void,
  ): (req: IncomingMessage, res: ServerResponse) => void {
    return timeResponses(this.requests, (path) => ({ route: routeLabel(path) }), handler);
  }

  /** The metrics listener: GET /metrics and nothing else. */
  readonly handler = (req: IncomingMessage, res: ServerResponse): void => {
    const answer = (status: number, body: string) => {
      res.writeHead(status, { 'Content-Type': 'text/plain', 'Content-Length': Buffer.byteLength(body) });
      res.end(body);
    };
    if ((req.url ?? '/').split('?')[0] !== '/metrics') return answer(404, 'only /metrics is served here\n');
    if (req.method !== 'GET' && req.method !== 'HEAD') return answer(405, `method ${req.method} not allowed\n`);
    scrapeRegistry(this.registry, res).catch((error: unknown) => answer(500, `${String(error)}\n`));
  };

  /** Wraps the container-credentials handler: every response counted by status. */
  instrumentContainer(
    handler: (req: IncomingMessage, res: ServerResponse) => void,
  ): (req: IncomingMessage, res: ServerResponse) => void {
    return timeResponses(this.containerRequests, () => ({}), handler);
  }

  countTokenReview(outcome: 'cached' | 'accepted' | 'refused' | 'error'): void {
    this.tokenReviews.inc({ outcome });
  }

  stop(): void {
    this.owned.unsubscribe();
    this.registry.clear();
  }
}

/** Answers a Prometheus scrape with the registry's text. */
export async function scrapeRegistry(registry: Registry, res: ServerResponse): Promise<void> {
  const body = await registry.metrics();
  res.writeHead(200, { 'Content-Type': registry.contentType, 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}

type Handler = (req: IncomingMessage, res: ServerResponse) => void;

/** Wraps a handler: every response observed in the histogram, labelled from its path, with its status (or aborted) when it finishes. */
export function timeResponses<L extends string>(
  histogram: Histogram<L>,
  labelsOf: (path: string) => Partial<Record<L, string>>,
  handler: Handler,
): Handler {
  return (req, res) => {
    const stop = histogram.startTimer(labelsOf((req.url ?? '/').split('?')[0] as string));
    res.once('close', () =>
      stop({ status: res.writableFinished ? String(res.statusCode) : 'aborted' } as Partial<Record<L, string>>),
    );
    handler(req, res);
  };
}
