/**
 * The webhook's HTTP handler: POST /mutate reads an AdmissionReview, asks the pure mutation what
 * to add, and answers with the patch; /healthz, /readyz and /metrics beside it. Malformed input is
 * a 400 with the reason; anything that is not a Pod CREATE is allowed untouched.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { readBody } from '../http/body.js';
import { AdmissionReview, Pod, admissionResponse } from './admission.js';
import type { WebhookMetrics } from './metrics.js';
import { type Selection, type WiringSettings, wirePod } from './mutation.js';

/** The API server sends at most its request limit (3 MiB) plus the review around it. */
export const MAX_REVIEW_BYTES = 4 * 1024 * 1024;
/** /mutate for pods sent because their namespace opted in, /mutate/annotated for pods sent because they ask themselves. */
const MUTATE_PATHS: Record<string, Selection> = { '/mutate': 'namespace', '/mutate/annotated': 'annotation' };
export const WEBHOOK_PATHS = [...Object.keys(MUTATE_PATHS), '/healthz', '/readyz', '/metrics'];

export interface WebhookHandlerOptions {
  readonly settings: WiringSettings;
  readonly logger: Logger;
  readonly metrics: WebhookMetrics;
  /** False while shutting down, so the Service stops sending reviews before the server closes. */
  readonly ready: () => boolean;
}

class BadReview extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

const json = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) => {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text), ...headers });
  res.end(text);
};

export function webhookHandler(options: WebhookHandlerOptions): (req: IncomingMessage, res: ServerResponse) => void {
  const { logger, metrics } = options;
  return (req, res) => {
    const url = new URL(req.url ?? '/', 'https://webhook');
    switch (url.pathname) {
      case '/healthz':
        return json(res, 200, { status: 'ok' });
      case '/readyz':
        return options.ready() ? json(res, 200, { status: 'ready' }) : json(res, 503, { status: 'shutting down' });
      case '/metrics':
        return void metrics.scrape(res).catch((error: unknown) => json(res, 500, { error: String(error) }));
      default: {
        const selection = MUTATE_PATHS[url.pathname];
        if (!selection) return json(res, 404, { error: `${url.pathname} not found` });
        if (req.method !== 'POST')
          return json(res, 405, { error: `method ${req.method} not allowed: POST an AdmissionReview` });
        return void review(req, selection, options).then(
          (answer) => json(res, 200, answer),
          (error: unknown) => {
            const status = error instanceof BadReview ? error.status : 500;
            metrics.admission('invalid');
            logger.warn(
              { status, reason: String(error instanceof Error ? error.message : error) },
              'admission review refused',
            );
            // A body left unread (too large) would desynchronise the connection: close it after the answer.
            const unread = !req.readableEnded;
            json(
              res,
              status,
              { error: error instanceof Error ? error.message : String(error) },
              unread ? { Connection: 'close' } : {},
            );
            if (unread) res.once('finish', () => req.socket.destroySoon());
          },
        );
      }
    }
  };
}

async function review(req: IncomingMessage, selection: Selection, options: WebhookHandlerOptions) {
  if (!/^application\/json\b/.test(req.headers['content-type'] ?? ''))
    throw new BadReview(415, 'expected Content-Type: application/json');
  const body = await readBody(
    req,
    MAX_REVIEW_BYTES,
    () => new BadReview(413, `AdmissionReview larger than ${MAX_REVIEW_BYTES} bytes`),
  );
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch (error) {
    throw new BadReview(400, `malformed JSON: ${(error as Error).message}`);
  }
  const checked = AdmissionReview.safeParse(parsed);
  if (!checked.success)
    throw new BadReview(
      400,
      `not an admission.k8s.io/v1 AdmissionReview request: ${describeIssues(checked.error.issues)}`,
    );
  const { request } = checked.data;
  const context = {
    uid: request.uid,
    namespace: request.namespace,
    operation: request.operation,
    kind: request.kind.kind,
  };
  if (request.kind.group !== '' || request.kind.kind !== 'Pod' || request.operation !== 'CREATE') {
    options.metrics.admission('ignored');
    options.logger.debug(context, 'not a pod creation: allowed untouched');
    return admissionResponse(request.uid, [], []);
  }
  const pod = Pod.safeParse(request.object);
  if (!pod.success) {
    // The API server's own validation rejects the pod with a better message than ours.
    options.metrics.admission('left-as-is');
    return admissionResponse(
      request.uid,
      [],
      [`kube-iam-broker did not wire this pod: ${describeIssues(pod.error.issues)}`],
    );
  }
  const wiring = wirePod(pod.data, options.settings, selection);
  options.metrics.admission(wiring.outcome);
  const name = pod.data.metadata.name ?? `${pod.data.metadata.generateName ?? ''}*`;
  options.logger.info(
    {
      ...context,
      pod: name,
      selection,
      outcome: wiring.outcome,
      containers: wiring.containers,
      warnings: wiring.warnings,
    },
    `pod ${wiring.outcome}`,
  );
  return admissionResponse(request.uid, wiring.patch, wiring.warnings);
}

/** The first few zod issues as "path: message", bounded so a huge bad review gives a short reason. */
const describeIssues = (issues: ReadonlyArray<{ path: PropertyKey[]; message: string }>): string =>
  issues
    .slice(0, 5)
    .map((issue) => `${issue.path.map(String).join('.') || '(root)'}: ${issue.message}`)
    .join('; ');
