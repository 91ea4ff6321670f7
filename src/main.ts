/**
 * Composition root: configuration in, a running agent out. Every long-lived resource made here
 * (informers, servers, subscriptions, timers) is ended by stop().
 */
import type { Logger } from 'pino';
import { Subscription, map, merge } from 'rxjs';
import { Coalescer, refusalKey } from './audit/coalesce.js';
import { AuditStream } from './audit/events.js';
import { retryDelayMs } from './backoff.js';
import { BrokerMetrics } from './admin/metrics.js';
import { adminHandler } from './admin/server.js';
import { assertAdminProtected, bearerAuthorizer } from './admin/auth.js';
import { EventFeed } from './audit/sse.js';
import { Broker } from './broker/broker.js';
import type { RolePolicy } from './broker/policy.js';
import { type AppliedEvent, type IndexEvent, LivePodIndex, indexDoubt } from './broker/pod-index.js';
import { watchTimeoutWithin } from './cluster/informer.js';
import { type KubeConnection, loadKubeConnection } from './cluster/kube-connection.js';
import { namespaceEvents } from './cluster/namespaces.js';
import { podEventRecorder, recordRoleDenials } from './cluster/pod-events.js';
import { podEvents } from './cluster/pods.js';
import { serviceAccountEvents } from './cluster/service-accounts.js';
import { ConfigError, deprecationWarnings } from './config/load.js';
import type { Config } from './config/schema.js';
import { credentialSupply } from './credentials/layers.js';
import { prefetchCredentials } from './credentials/prefetch.js';
import { stsCallEvent } from './credentials/report.js';
import { createStsClient, stsAssumeRole } from './credentials/sts.js';
import { CallerLimits } from './http/caller-limits.js';
import { type ConnectionLimits, type ListeningServer, listen } from './http/listen.js';
import { clientHold } from './imds/client-holds.js';
import { callerSubject, imdsHandler } from './imds/server.js';
import { TokenIssuer } from './imds/tokens.js';
import { Upstream, memoizeUntilSuccess } from './imds/upstream.js';
import { startContainerDoor } from './container/door.js';
import { ReviewCache } from './container/review-cache.js';
import { containerHandler } from './container/server.js';
import { tokenReviewer } from './container/token-review.js';
import { logAuditEvents } from './log.js';
import { startNodeIntegration } from './node/lifecycle.js';

export interface AgentDependencies {
  readonly logger: Logger;
  /** Defaults to BROKER_KUBECONFIG (or KUBECONFIG) when set, else the in-cluster service account. */
  readonly kube?: KubeConnection;
  /** Log lines the logger's destination dropped, for /metrics. */
  readonly logLinesDropped?: () => number;
}

export interface RunningAgent {
  readonly imds: ListeningServer;
  /** Absent when BROKER_CONTAINER_LISTEN is off or its address could not be taken. */
  readonly container: ListeningServer | undefined;
  readonly admin: ListeningServer;
  readonly metrics: ListeningServer;
  readonly audit: AuditStream;
  readonly index: LivePodIndex;
  stop(): Promise<void>;
}

/** Distinct (caller, refusal) pairs coalesced per interval; beyond it refusals are published one by one, still bounded by the per-caller rate. */
const COALESCED_KEYS_MAX = 10_000;
/** In-flight requests get this long to finish at shutdown. */
const DRAIN_MS = 5_000;
const BASE_ARN_RETRY = { initialMs: 1_000, maxMs: 30_000 };
/** Token reviews remembered (by hash) at most, and how long a refusal is. */
const TOKEN_REVIEWS_MAX = 10_000;
const TOKEN_REFUSAL_TTL_MS = 10_000;

/** A listen failure the operator can fix, as a ConfigError naming the option; anything else as is. */
async function listenFor(
  variable: string,
  handler: Parameters<typeof listen>[0],
  hostPort: string,
  options?: Parameters<typeof listen>[2],
): Promise<ListeningServer> {
  try {
    return await listen(handler, hostPort, options);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    const why: Record<string, string> = {
      EADDRINUSE:
        'is already in use by another process (kube2iam also wants 8181: while it runs on the node, give this agent another port)',
      EACCES: 'is not permitted (a port below 1024 needs root or CAP_NET_BIND_SERVICE)',
      EADDRNOTAVAIL: 'is not an address of this host',
    };
    if (code && why[code]) throw new ConfigError([`${variable} ${hostPort} ${why[code]}`]);
    throw error;
  }
}

export async function startAgent(config: Config, dependencies: AgentDependencies): Promise<RunningAgent> {
  const { logger } = dependencies;
  assertAdminProtected(config.adminListen, config.adminToken);
  const kube = dependencies.kube ?? loadKubeConnection(config.kubeconfig);
  const owned = new Subscription();
  const timers = new Set<NodeJS.Timeout>();

  const audit = new AuditStream();
  owned.add(logAuditEvents(audit.events$, logger));
  const eventFeed = new EventFeed({
    events$: audit.events$,
    bufferSize: config.eventsBuffer,
    heartbeatMs: config.eventsHeartbeat * 1000,
    subscriberBufferBytes: config.eventsSubscriberBufferBytes,
    maxSubscribers: config.eventsMaxSubscribers,
  });
  owned.add(() => eventFeed.close());
  const refusals = new Coalescer({
    intervalMs: config.auditCoalesceInterval * 1000,
    maxKeys: COALESCED_KEYS_MAX,
    keyOf: refusalKey,
    publish: (body) => audit.publish(body),
  });
  owned.add(() => refusals.stop());

  const index = new LivePodIndex(config.nodeName);
  owned.add(index.applied$.subscribe((applied) => reportIndexChange(applied, audit, logger)));
  const watchTimeout = watchTimeoutWithin(config.watchDeadlineSeconds);
  const clusterEvents = merge(
    podEvents(kube, config.nodeName, [config.roleAnnotation, config.externalIdAnnotation], watchTimeout).pipe(
      map((event): IndexEvent => ({ resource: 'pods', event })),
    ),
    namespaceEvents(kube, [config.namespaceKey, config.namespacePermittedKey], watchTimeout).pipe(
      map((event): IndexEvent => ({ resource: 'namespaces', event })),
    ),
    serviceAccountEvents(kube, [config.roleAnnotation], watchTimeout).pipe(
      map((event): IndexEvent => ({ resource: 'serviceaccounts', event })),
    ),
  );
  // Namespaces decide roles only under namespace restrictions; pods and their ServiceAccounts always do.
  const vouchedResources: ReadonlyArray<IndexEvent['resource']> = config.namespaceRestrictions
    ? ['pods', 'serviceaccounts', 'namespaces']
    : ['pods', 'serviceaccounts'];
  owned.add(index.connect(clusterEvents));

  const upstream = new Upstream(config.metadataUpstream);
  let discoveredBaseArn: string | undefined;
  if (config.baseRoleArn === undefined) {
    const discover = async (attempt: number): Promise<void> => {
      try {
        const node = await upstream.nodeIdentity();
        discoveredBaseArn = `arn:${node.partition}:iam::${node.accountId}:role/`;
        logger.info({ baseRoleArn: discoveredBaseArn }, 'discovered the base role ARN from the node');
      } catch (error) {
        const retryInMs = retryDelayMs(attempt, BASE_ARN_RETRY);
        logger.warn(
          { err: String(error), retryInMs },
          'cannot discover the base role ARN yet; bare role names get 503 until then',
        );
        const timer = setTimeout(() => {
          timers.delete(timer);
          void discover(attempt + 1);
        }, retryInMs);
        timers.add(timer);
      }
    };
    void discover(0);
  }

  const stsClient = createStsClient(memoizeUntilSuccess(() => upstream.region()));
  const policy: RolePolicy = {
    roleAnnotation: config.roleAnnotation,
    externalIdAnnotation: config.externalIdAnnotation,
    defaultRole: config.defaultRole,
    ...(config.namespaceRestrictions
      ? {
          namespaceRestrictions: {
            annotation: config.namespaceKey,
            permittedAnnotation: config.namespacePermittedKey,
            format: config.namespaceRestrictionFormat,
          },
        }
      : {}),
  };
  const baseRoleArn = () => config.baseRoleArn ?? discoveredBaseArn;

  // Credential supply: rate-limited STS with retries, prefetch on pod arrival, refresh ahead, metrics.
  const credentials = credentialSupply({
    assumeRole: stsAssumeRole(stsClient),
    sessionDurationSeconds: config.sessionDurationSeconds,
    rateLimit: { ratePerSecond: config.stsQps, burst: config.stsBurst },
    maxEntries: config.credentialCacheMax,
    prefetch: config.prefetch,
    onStsCall: (report) => audit.publish(stsCallEvent(report)),
  });
  owned.add(() => credentials.stop());
  owned.add(
    prefetchCredentials({ applied$: index.applied$, view: index.view, policy, baseRoleArn, cache: credentials }),
  );
  const metrics = new BrokerMetrics({
    events$: audit.events$,
    applied$: index.applied$,
    index: index.view,
    waitingLookups: () => index.waitingKeys(),
    cacheSize: () => credentials.size(),
    queuedStsCalls: () => credentials.queuedCalls(),
    logLinesDropped: dependencies.logLinesDropped,
  });
  owned.add(() => metrics.stop());

  const broker = new Broker({ index, policy, needsNamespace: config.namespaceRestrictions, baseRoleArn });

  // Namespace restrictions: a refused role is also a Kubernetes Event on the pod.
  if (config.namespaceRestrictions)
    owned.add(recordRoleDenials(audit.events$, index.view, podEventRecorder(kube, logger, config.nodeName)));

  const callerLimits = new CallerLimits({
    ratePerSecond: config.callerRate,
    burst: config.callerBurst,
    maxConnections: config.callerMaxConnections,
    maxWaiting: config.callerMaxWaiting,
  });
  // One budget per caller and per node across both doors: a pod cannot double it by using the other one.
  const connectionLimits: ConnectionLimits = {
    maxConnections: config.maxConnections,
    open: (ip) => callerLimits.openConnection(ip),
    close: (ip) => callerLimits.closeConnection(ip),
    onRefused: (ip) =>
      refusals.record({
        type: 'request.throttled',
        ...callerSubject(ip, index.view.ownerOf(ip)),
        limit: 'connections',
      }),
  };
  const closeOnFailure = async <T>(opening: Promise<T>, opened: readonly ListeningServer[]): Promise<T> =>
    opening.catch(async (error: unknown) => {
      await Promise.all(opened.map((server) => server.close(0)));
      for (const timer of timers) clearTimeout(timer);
      owned.unsubscribe();
      stsClient.destroy();
      await upstream.close();
      throw error;
    });
  const imds = await closeOnFailure(
    listenFor(
      'BROKER_LISTEN',
      metrics.instrument(
        imdsHandler({
          broker,
          index: index.view,
          credentials: credentials.supply,
          holdFor: (userAgent) => clientHold(userAgent, config),
          tokens: new TokenIssuer(),
          tokensRequired: config.imdsTokens === 'required',
          upstream,
          allow: new RegExp(config.metadataAllow),
          limits: callerLimits,
          publish: refusals.record,
          logger,
          indexDoubt: () => indexDoubt(index.view, vouchedResources),
        }),
      ),
      config.listen,
      {
        limits: connectionLimits,
      },
    ),
    [],
  );
  const admin = await closeOnFailure(
    listenFor(
      'BROKER_ADMIN_LISTEN',
      adminHandler({ index: index.view, events: eventFeed.handle, authorized: bearerAuthorizer(config.adminToken) }),
      config.adminListen,
    ),
    [imds],
  );
  const metricsServer = await closeOnFailure(
    listenFor('BROKER_METRICS_LISTEN', metrics.handler, config.metricsListen),
    [imds, admin],
  );
  const reviews = new ReviewCache({
    review: tokenReviewer(kube, config.tokenAudience),
    maxEntries: TOKEN_REVIEWS_MAX,
    refusalTtlMs: TOKEN_REFUSAL_TTL_MS,
  });
  owned.add(
    index.applied$.subscribe(({ event }) => {
      if (event.resource === 'pods' && event.event.type === 'delete') reviews.forgetPod(event.event.object.uid);
    }),
  );
  const container =
    config.containerListen === 'off'
      ? undefined
      : await startContainerDoor({
          listen: config.containerListen,
          link: config.containerLink,
          limits: connectionLimits,
          logger,
          handler: (hosts) =>
            metrics.instrumentContainer(
              containerHandler({
                index: index.view,
                indexDoubt: () => indexDoubt(index.view, vouchedResources),
                nodeName: config.nodeName,
                policy,
                baseRoleArn,
                credentials: credentials.supply,
                reviews,
                audience: config.tokenAudience,
                hosts,
                limits: callerLimits,
                publish: refusals.record,
                onReview: (outcome) => metrics.countTokenReview(outcome),
                logger,
              }),
            ),
        });
  for (const warning of deprecationWarnings(config)) logger.warn(warning);
  if (!config.namespaceRestrictions) {
    logger.warn(
      'namespace restrictions are off (BROKER_NAMESPACE_RESTRICTIONS=false): anyone who can create a pod can take any role the node can assume (SECURITY.md)',
    );
  }

  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      await node.stop(); // ends the rule upkeep (the rules stay unless BROKER_IPTABLES_REMOVE_ON_EXIT), then requests drain
      // Event subscribers would hold the admin server open for the whole drain time.
      eventFeed.close();
      await Promise.all([
        imds.close(DRAIN_MS),
        container?.close(DRAIN_MS),
        admin.close(DRAIN_MS),
        metricsServer.close(DRAIN_MS),
      ]);
      for (const timer of timers) clearTimeout(timer);
      owned.unsubscribe();
      audit.complete();
      stsClient.destroy();
      await upstream.close();
      logger.info('kube-iam-broker stopped');
    })());

  // Node integration (src/node/): the DNAT rule and its upkeep, stale metadata connections, the readiness taint.
  const node = startNodeIntegration(config, { logger, audit, index, kube, agentPort: imds.address.port });
  await node.started.catch(async (error: unknown) => {
    await stop();
    throw error;
  });
  logger.info(
    {
      listen: config.listen,
      admin: config.adminListen,
      metrics: config.metricsListen,
      node: config.nodeName ?? '(all nodes)',
      graceWindowMs: config.graceWindowMs,
    },
    'kube-iam-broker started',
  );

  return { imds, container, admin, metrics: metricsServer, audit, index, stop };
}

/** Pods gaining or losing an IP are audit events; informer trouble is logged. */
function reportIndexChange({ event, change }: AppliedEvent, audit: AuditStream, logger: Logger): void {
  if (event.event.type === 'disconnected')
    logger.warn(
      { resource: event.resource, err: event.event.error, retryInMs: event.event.retryInMs },
      'watch failed; serving the last known state',
    );
  if (event.event.type === 'invalid')
    logger.warn({ resource: event.resource, reason: event.event.reason }, 'ignored an object that does not validate');
  if (event.event.type === 'synced') logger.info({ resource: event.resource }, 'informer synced');
  for (const { ip, before, after } of change.ownerChanges) {
    if (after) {
      audit.publish({
        type: 'pod.indexed',
        podIp: ip,
        namespace: after.namespace,
        pod: after.name,
        serviceAccount: after.serviceAccount,
        previousPod: before ? `${before.namespace}/${before.name}` : undefined,
      });
    } else if (before) {
      audit.publish({
        type: 'pod.removed',
        podIp: ip,
        namespace: before.namespace,
        pod: before.name,
        serviceAccount: before.serviceAccount,
      });
    }
  }
}
