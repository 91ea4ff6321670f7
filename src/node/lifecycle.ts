/**
 * The agent's part in the node: the DNAT rule that brings pods' metadata traffic to it (installed
 * at start, kept in place, removed at exit), the stale connections that bypass a new rule, and the
 * readiness taint that keeps credential-hungry pods off the node until the agent can serve them.
 */
import type { Logger } from 'pino';
import { BehaviorSubject, type Observable, Subscription, combineLatest, defer, exhaustMap, first, interval, map, retry, startWith, switchMap, timer } from 'rxjs';
import { z } from 'zod';
import { readiness } from '../admin/server.js';
import type { AuditStream } from '../audit/events.js';
import type { LivePodIndex } from '../broker/pod-index.js';
import type { KubeConnection } from '../cluster/kube-connection.js';
import { retryDelayMs } from '../backoff.js';
import { ConfigError } from '../config/load.js';
import type { Config } from '../config/schema.js';
import { dropUnredirectedConnections } from './conntrack.js';
import { type DnatTarget, DnatRule, resolveIptablesBinary } from './iptables.js';
import { type NodeApi, type TaintSpec, formatTaint, nodeApi, removeNodeTaint } from './taint.js';

export interface NodeIntegrationDependencies {
  readonly logger: Logger;
  readonly audit: AuditStream;
  readonly index: LivePodIndex;
  readonly kube: KubeConnection;
  /** The port the metadata server is bound to (BROKER_LISTEN may ask for port 0). */
  readonly agentPort: number;
}

export interface NodeIntegration {
  /** Resolves once the DNAT rule is in place (at once without BROKER_IPTABLES); rejects when it cannot be. */
  readonly started: Promise<void>;
  /**
   * The first step of shutdown: ends the upkeep and the taint gate, then removes the rule unless
   * BROKER_IPTABLES_REMOVE_ON_EXIT=false. Never rejects: a failed removal is logged.
   */
  stop(): Promise<void>;
}

/** Retries of the taint removal while the API server is unreachable or refuses. */
const TAINT_RETRY = { initialMs: 500, maxMs: 30_000 };

type Phase = 'start' | 'check';

export function startNodeIntegration(config: Config, dependencies: NodeIntegrationDependencies): NodeIntegration {
  const { logger, audit, index } = dependencies;
  const owned = new Subscription();
  const ruleInPlace = new BehaviorSubject(!config.iptables);
  let rule: DnatRule | undefined;
  // Rule operations run one at a time: a periodic check never overlaps the removal at exit.
  let ruleOperations: Promise<void> = Promise.resolve();
  let stopping = false;
  const serially = (operation: () => Promise<void>): Promise<void> => {
    const run = ruleOperations.then(operation);
    ruleOperations = run.catch(() => undefined);
    return run;
  };

  const dropStaleConnections = async (target: DnatTarget) => {
    if (!config.dropConnections) return;
    try {
      const count = await dropUnredirectedConnections(target.metadataAddress, target.metadataPort);
      audit.publish({ type: 'node.conntrack', action: 'dropped', count, detail: `connections to ${target.metadataAddress}:${target.metadataPort} not yet redirected to the agent` });
    } catch (error) {
      logger.error({ err: String(error) }, 'cannot drop connections that bypass the DNAT rule; clients holding them keep reaching the metadata service directly until they reconnect');
    }
  };

  const ensureRule = (phase: Phase) =>
    serially(async () => {
      if (!rule || stopping) return;
      const outcome = await rule.ensure();
      if (phase === 'check' && outcome === 'in-place') return;
      const action = phase === 'start' ? outcome : 'reinstalled';
      if (action === 'reinstalled') logger.warn({ rule: rule.describe() }, 'the DNAT rule was removed by something else; re-installed it');
      audit.publish({ type: 'node.iptables', action, detail: rule.describe() });
      await dropStaleConnections(rule.target);
    });

  const started = (async () => {
    const problems = nodeConfigProblems(config);
    if (problems.length > 0) throw new ConfigError(problems);
    if (!config.iptables) return;
    rule = new DnatRule(await resolveIptablesBinary(config.iptablesBinary), dnatTarget(config, dependencies.agentPort));
    await ensureRule('start');
    ruleInPlace.next(true);
    owned.add(
      interval(config.iptablesCheckIntervalSeconds * 1000)
        .pipe(exhaustMap(() => ensureRule('check').catch((error: unknown) => logger.error({ err: String(error) }, 'cannot check the DNAT rule; will try again'))))
        .subscribe(),
    );
  })();

  if (config.nodeTaint && config.nodeName) {
    owned.add(removeTaintWhenReady(nodeApi(dependencies.kube), config.nodeName, config.nodeTaint, ruleInPlace, index, logger));
  }

  return {
    started,
    async stop() {
      owned.unsubscribe();
      await started.catch(() => undefined); // a start still installing must finish before removal
      await serially(async () => {
        stopping = true;
        if (!rule || !config.iptablesRemoveOnExit) return;
        try {
          if (await rule.remove()) audit.publish({ type: 'node.iptables', action: 'removed', detail: rule.describe() });
        } catch (error) {
          logger.error({ err: String(error) }, `cannot remove the DNAT rule; remove it by hand: ${rule.binary} -t nat -D PREROUTING ...`);
        }
      });
    },
  };
}

/** The combinations a single option's schema cannot check. */
function nodeConfigProblems(config: Config): string[] {
  const problems: string[] = [];
  if (config.nodeTaint && !config.nodeName) problems.push('BROKER_NODE_TAINT needs BROKER_NODE_NAME: the agent only ever removes the taint from its own node');
  if (!config.iptables) return problems;
  if (!config.hostInterface) problems.push('BROKER_IPTABLES needs BROKER_HOST_INTERFACE (cali+, eni+, veth+, docker0, ...): the interfaces pods\' traffic arrives on');
  const agentAddress = agentAddressOf(config);
  if (!agentAddress) problems.push('BROKER_IPTABLES needs BROKER_HOST_IP (status.hostIP from the downward API) when BROKER_LISTEN does not name an address');
  else if (agentAddress.startsWith('127.')) problems.push(`BROKER_HOST_IP ${agentAddress} is a loopback address: the kernel drops pod traffic DNATed to loopback`);
  if (!z.ipv4().safeParse(new URL(config.metadataUpstream).hostname).success) {
    problems.push(`BROKER_IPTABLES needs an IPv4 address in BROKER_METADATA_UPSTREAM (${config.metadataUpstream}): it is the address the rule redirects`);
  }
  return problems;
}

function agentAddressOf(config: Config): string | undefined {
  const listenHost = config.listen.slice(0, config.listen.lastIndexOf(':'));
  return config.hostIp ?? (z.ipv4().safeParse(listenHost).success && listenHost !== '0.0.0.0' ? listenHost : undefined);
}

/** The metadata address is BROKER_METADATA_UPSTREAM's (kube2iam's --metadata-addr): one option, not two. */
function dnatTarget(config: Config, agentPort: number): DnatTarget {
  const upstream = new URL(config.metadataUpstream);
  return {
    metadataAddress: upstream.hostname,
    metadataPort: upstream.port ? Number(upstream.port) : upstream.protocol === 'https:' ? 443 : 80,
    agentAddress: agentAddressOf(config) as string,
    agentPort,
    hostInterface: config.hostInterface as string,
  };
}

/**
 * Removes the readiness taint once pods can be served: the rule is in place and the informers
 * have synced (what /readyz reports). Retries with backoff until it succeeds or the agent stops.
 */
function removeTaintWhenReady(api: NodeApi, nodeName: string, taint: TaintSpec, ruleInPlace: Observable<boolean>, index: LivePodIndex, logger: Logger): Subscription {
  const informersReady = index.applied$.pipe(
    startWith(undefined),
    map(() => readiness(index.view).ready),
  );
  const fields = { node: nodeName, taint: formatTaint(taint) };
  return combineLatest([ruleInPlace, informersReady])
    .pipe(
      first(([rule, informers]) => rule && informers),
      switchMap(() =>
        defer(() => removeNodeTaint(api, nodeName, taint)).pipe(
          retry({
            delay: (error: unknown, attempt) => {
              const retryInMs = retryDelayMs(attempt - 1, TAINT_RETRY);
              logger.warn({ ...fields, err: String(error), retryInMs }, 'cannot remove the readiness taint yet');
              return timer(retryInMs);
            },
          }),
        ),
      ),
    )
    .subscribe((outcome) => logger.info({ ...fields, outcome }, outcome === 'removed' ? 'removed the readiness taint: pods can be scheduled here' : 'the readiness taint was not on the node'));
}
