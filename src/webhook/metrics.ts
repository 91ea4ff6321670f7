/** The webhook's Prometheus metrics: admissions by outcome, request latency, certificate reloads and expiry. */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { LATENCY_BUCKETS, PREFIX, scrapeRegistry, timeResponses } from '../admin/metrics.js';
import type { ReloadOutcome } from './serving-certificate.js';

export class WebhookMetrics {
  readonly registry = new Registry();
  private readonly requests: Histogram<'path' | 'status'>;
  private readonly admissions: Counter<'outcome'>;
  private readonly reloads: Counter<'outcome'>;
  private readonly notAfter: Gauge;

  constructor() {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry, prefix: PREFIX });
    this.requests = new Histogram({
      name: `${PREFIX}webhook_request_duration_seconds`,
      help: 'Webhook requests by path and status, and how long they took.',
      labelNames: ['path', 'status'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.admissions = new Counter({
      name: `${PREFIX}webhook_admissions_total`,
      help: 'AdmissionReviews answered, by outcome: wired, already-wired, left-as-is (the pod has its own AWS credentials), opted-out, not-selected, ignored (not a Pod CREATE), invalid (400).',
      labelNames: ['outcome'],
      registers,
    });
    this.reloads = new Counter({
      name: `${PREFIX}webhook_certificate_reloads_total`,
      help: 'Serving certificate re-reads after the files changed, by outcome (loaded, failed: the previous pair keeps serving).',
      labelNames: ['outcome'],
      registers,
    });
    this.notAfter = new Gauge({
      name: `${PREFIX}webhook_certificate_not_after_seconds`,
      help: 'Expiry of the serving certificate in use (Unix time).',
      registers,
    });
  }

  admission(outcome: string): void {
    this.admissions.inc({ outcome });
  }

  certificate(outcome: ReloadOutcome | 'initial', notAfter?: Date): void {
    if (outcome !== 'initial') this.reloads.inc({ outcome });
    if (notAfter) this.notAfter.set(notAfter.getTime() / 1000);
  }

  /** Wraps the handler: every response counted by path (bounded: known paths or "other") and status. */
  instrument(
    paths: readonly string[],
    handler: (req: IncomingMessage, res: ServerResponse) => void,
  ): (req: IncomingMessage, res: ServerResponse) => void {
    return timeResponses(this.requests, (path) => ({ path: paths.includes(path) ? path : 'other' }), handler);
  }

  scrape(res: ServerResponse): Promise<void> {
    return scrapeRegistry(this.registry, res);
  }
}
