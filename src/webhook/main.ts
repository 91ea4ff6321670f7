/** `kube-iam-broker webhook`: the HTTPS admission webhook, from the shared configuration. */
import { isIP } from 'node:net';
import type { Server as TlsServer } from 'node:tls';
import type { Logger } from 'pino';
import { ConfigError } from '../config/load.js';
import type { Config } from '../config/schema.js';
import { type ListeningServer, listen, splitHostPort } from '../http/listen.js';
import { WebhookMetrics } from './metrics.js';
import type { WiringSettings } from './mutation.js';
import { ServingCertificate } from './serving-certificate.js';
import { WEBHOOK_PATHS, webhookHandler } from './server.js';

/** Hosts the AWS SDKs call over plain http for container credentials (they check the host, not the port). */
const SDK_ACCEPTED_HOSTS = new Set(['169.254.170.23', '169.254.170.2', 'fd00:ec2::23', '::1', 'localhost']);
const SHUTDOWN_GRACE_MS = 5_000;

/** What the webhook writes into pods, from BROKER_CONTAINER_LISTEN and the token settings. */
export function wiringSettings(
  config: Pick<Config, 'containerListen' | 'tokenAudience' | 'webhookTokenExpiration'>,
): WiringSettings {
  if (config.containerListen === 'off')
    throw new ConfigError([
      'BROKER_CONTAINER_LISTEN is off: the webhook has no container-credentials endpoint to wire pods to',
    ]);
  const { host, port } = splitHostPort(config.containerListen);
  if (!SDK_ACCEPTED_HOSTS.has(host) && !(isIP(host) === 4 && host.startsWith('127.'))) {
    throw new ConfigError([
      `BROKER_CONTAINER_LISTEN is ${config.containerListen}: the SDKs refuse plain-http container credentials from ${host} (use 169.254.170.23, 169.254.170.2, fd00:ec2::23 or loopback)`,
    ]);
  }
  const authority = `${isIP(host) === 6 ? `[${host}]` : host}${port === 80 ? '' : `:${port}`}`;
  return {
    credentialsUri: `http://${authority}/v1/credentials`,
    credentialsHost: host,
    audience: config.tokenAudience,
    expirationSeconds: config.webhookTokenExpiration,
  };
}

export interface RunningWebhook {
  readonly server: ListeningServer;
  stop(): Promise<void>;
}

export async function startWebhook(config: Config, { logger }: { logger: Logger }): Promise<RunningWebhook> {
  const settings = wiringSettings(config);
  if (!config.webhookTlsCert || !config.webhookTlsKey) {
    throw new ConfigError([
      'the webhook serves only HTTPS: set BROKER_WEBHOOK_TLS_CERT and BROKER_WEBHOOK_TLS_KEY (see `kube-iam-broker webhook-certs`)',
    ]);
  }
  const metrics = new WebhookMetrics();
  let ready = true;
  let server: ListeningServer | undefined;
  const files = { certFile: config.webhookTlsCert, keyFile: config.webhookTlsKey };
  const certificate = loadServingCertificate(files, (outcome, detail) => {
    metrics.certificate(outcome, detail.notAfter);
    if (outcome === 'failed')
      return logger.warn({ error: detail.error }, 'serving certificate not reloaded: the previous one keeps serving');
    // Clients without SNI get the server's default context: it follows the reload too.
    (server?.server as TlsServer | undefined)?.setSecureContext(certificate.current.pem);
    logger.info({ notAfter: detail.notAfter?.toISOString() }, 'serving certificate reloaded');
  });
  metrics.certificate('initial', certificate.current.notAfter);
  const handler = metrics.instrument(WEBHOOK_PATHS, webhookHandler({ settings, logger, metrics, ready: () => ready }));
  try {
    server = await listen(handler, config.webhookListen, {
      tls: { ...certificate.current.pem, SNICallback: certificate.sniCallback, minVersion: 'TLSv1.2' },
    });
  } catch (error) {
    certificate.stop();
    throw error;
  }
  logger.info(
    {
      listen: `${server.address.address}:${server.address.port}`,
      credentialsUri: settings.credentialsUri,
      audience: settings.audience,
      notAfter: certificate.current.notAfter.toISOString(),
    },
    'webhook serving',
  );
  const running = server;
  return {
    server: running,
    async stop() {
      ready = false;
      certificate.stop();
      await running.close(SHUTDOWN_GRACE_MS);
    },
  };
}

function loadServingCertificate(...args: ConstructorParameters<typeof ServingCertificate>): ServingCertificate {
  try {
    return new ServingCertificate(...args);
  } catch (error) {
    const [{ certFile, keyFile }] = args;
    throw new ConfigError([
      `cannot serve with BROKER_WEBHOOK_TLS_CERT=${certFile} and BROKER_WEBHOOK_TLS_KEY=${keyFile}: ${(error as Error).message}`,
    ]);
  }
}
