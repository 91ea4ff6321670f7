/**
 * The agent's part in the node: the DNAT rule that brings pods' metadata traffic to it and the
 * guard that resets whatever of that traffic the rule did not redirect (IPv4, and IPv6 where the
 * node has it), installed at start and kept in place, also after the agent exits; the stale
 * connections that bypass a new rule; and the readiness taint that keeps credential-hungry pods
 * off the node until the agent can serve them.
 */
import type { Logger } from 'pino';
import {
  BehaviorSubject,
  type Observable,
  Subscription,
  combineLatest,
  defer,
  exhaustMap,
  first,
  interval,
  map,
  retry,
  startWith,
  switchMap,
  timer,
} from 'rxjs';
import { z } from 'zod';
import { readiness } from '../admin/server.js';
import type { AuditStream } from '../audit/events.js';
import type { LivePodIndex } from '../broker/pod-index.js';
import type { KubeConnection } from '../cluster/kube-connection.js';
import { retryDelayMs } from '../backoff.js';
import { ConfigError } from '../config/load.js';
import type { Config } from '../config/schema.js';
import { dropUnredirectedConnections } from './conntrack.js';
import { NodeToolError } from './exec.js';
import {
  DNAT_CHAIN,
  type DnatTarget,
  type EnsureOutcome,
  GUARD_CHAIN,
  OwnedChain,
  dnatRule,
  guardRule,
  ipv6Binary,
  resolveIptablesBinary,
} from './iptables.js';
import { IPV6_METADATA_ADDRESS, nodeHasIpv6 } from './ipv6.js';
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
   * The first step of shutdown: ends the upkeep and the taint gate. The rules stay, so pods get
   * connection refused (never the node's role) until the next agent starts, unless
   * BROKER_IPTABLES_REMOVE_ON_EXIT=true. Never rejects: a failed removal is logged.
   */
  stop(): Promise<void>;
}

/** Retries of the taint removal while the API server is unreachable or refuses. */
const TAINT_RETRY = { initialMs: 500, maxMs: 30_000 };

type Phase = 'start' | 'check';

/** One rule in one of our chains, and why it is there (said when it cannot be installed). */
interface PlacedRule {
  readonly chain: OwnedChain;
  readonly rule: readonly string[];
  readonly purpose: string;
}

/** The agent's rules on this node, installed in order and removed in reverse. */
class NodeRules {
  constructor(private readonly rules: readonly PlacedRule[]) {}

  async ensure(): Promise<EnsureOutcome> {
    let outcome: EnsureOutcome = 'in-place';
    for (const { chain, rule, purpose } of this.rules) {
      try {
        if ((await chain.ensure(rule)) === 'installed') outcome = 'installed';
      } catch (error) {
        throw new NodeToolError(
          `cannot install the ${purpose}: ${error instanceof Error ? error.message : String(error)}`,
        );
      }
    }
    return outcome;
  }

  async remove(): Promise<boolean> {
    let removedAny = false;
    for (const { chain } of [...this.rules].reverse()) if (await chain.remove()) removedAny = true;
    return removedAny;
  }

  describe(): string {
    return this.rules.map(({ chain, rule }) => chain.describe(rule)).join('; ');
  }
}

export function startNodeIntegration(config: Config, dependencies: NodeIntegrationDependencies): NodeIntegration {
  const { logger, audit, index } = dependencies;
  const owned = new Subscription();
  const ruleInPlace = new BehaviorSubject(!config.iptables);
  let rules: NodeRules | undefined;
  let dnat: DnatTarget | undefined;
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
      audit.publish({
        type: 'node.conntrack',
        action: 'dropped',
        count,
        detail: `connections to ${target.metadataAddress}:${target.metadataPort} not yet redirected to the agent`,
      });
    } catch (error) {
      logger.error(
        { err: String(error) },
        'cannot drop connections that bypass the DNAT rule; clients holding them keep reaching the metadata service directly until they reconnect',
      );
    }
  };

  const ensureRule = (phase: Phase) =>
    serially(async () => {
      if (!rules || !dnat || stopping) return;
      const outcome = await rules.ensure();
      if (phase === 'check' && outcome === 'in-place') return;
      const action = phase === 'start' ? outcome : 'reinstalled';
      if (action === 'reinstalled')
        logger.warn({ rules: rules.describe() }, 'a rule was removed or changed by something else; re-installed it');
      audit.publish({ type: 'node.iptables', action, detail: rules.describe() });
      await dropStaleConnections(dnat);
    });

  const started = (async () => {
    const problems = nodeConfigProblems(config);
    if (problems.length > 0) throw new ConfigError(problems);
    if (!config.iptables) return;
    const binary = await resolveIptablesBinary(config.iptablesBinary);
    dnat = dnatTarget(config, dependencies.agentPort);
    rules = new NodeRules(await placedRules(binary, dnat));
    await ensureRule('start');
    ruleInPlace.next(true);
    owned.add(
      interval(config.iptablesCheckIntervalSeconds * 1000)
        .pipe(
          exhaustMap(() =>
            ensureRule('check').catch((error: unknown) =>
              logger.error({ err: String(error) }, 'cannot check the DNAT rule; will try again'),
            ),
          ),
        )
        .subscribe(),
    );
  })();

  if (config.nodeTaint && config.nodeName) {
    owned.add(
      removeTaintWhenReady(nodeApi(dependencies.kube), config.nodeName, config.nodeTaint, ruleInPlace, index, logger),
    );
  }

  return {
    started,
    async stop() {
      owned.unsubscribe();
      await started.catch(() => undefined); // a start still installing must finish before removal
      await serially(async () => {
        stopping = true;
        if (!rules) return;
        if (!config.iptablesRemoveOnExit) {
          logger.info(
            { rules: rules.describe() },
            'left the rules in place: pods get connection refused until the next agent starts (kube-iam-broker node-cleanup removes them)',
          );
          return;
        }
        try {
          if (await rules.remove())
            audit.publish({ type: 'node.iptables', action: 'removed', detail: rules.describe() });
        } catch (error) {
          logger.error(
            { err: String(error) },
            'cannot remove the rules; run kube-iam-broker node-cleanup on this node',
          );
        }
      });
    },
  };
}

/** The combinations a single option's schema cannot check. */
function nodeConfigProblems(config: Config): string[] {
  const problems: string[] = [];
  if (config.nodeTaint && !config.nodeName)
    problems.push('BROKER_NODE_TAINT needs BROKER_NODE_NAME: the agent only ever removes the taint from its own node');
  if (!config.iptables) return problems;
  if (!config.hostInterface)
    problems.push(
      "BROKER_IPTABLES needs BROKER_HOST_INTERFACE (cali+, eni+, veth+, docker0, ...): the interfaces pods' traffic arrives on",
    );
  const agentAddress = agentAddressOf(config);
  if (!agentAddress)
    problems.push(
      'BROKER_IPTABLES needs BROKER_HOST_IP (status.hostIP from the downward API) when BROKER_LISTEN does not name an address',
    );
  else if (agentAddress.startsWith('127.'))
    problems.push(
      `BROKER_HOST_IP ${agentAddress} is a loopback address: the kernel drops pod traffic DNATed to loopback`,
    );
  if (!z.ipv4().safeParse(new URL(config.metadataUpstream).hostname).success) {
    problems.push(
      `BROKER_IPTABLES needs an IPv4 address in BROKER_METADATA_UPSTREAM (${config.metadataUpstream}): it is the address the rule redirects`,
    );
  }
  return problems;
}

function agentAddressOf(config: Config): string | undefined {
  const listenHost = config.listen.slice(0, config.listen.lastIndexOf(':'));
  return config.hostIp ?? (z.ipv4().safeParse(listenHost).success && listenHost !== '0.0.0.0' ? listenHost : undefined);
}

/**
 * The redirect first (new connections reach the agent at once), then the guard for IPv4, and the
 * guard for IPv6 when the node has IPv6: pods with IPv6 addresses could reach fd00:ec2::254, which
 * the agent does not serve, so they get a reset there and use IPv4. A node with IPv6 where
 * ip6tables fails makes the start fail, naming why.
 */
async function placedRules(binary: string, target: DnatTarget): Promise<PlacedRule[]> {
  const placed: PlacedRule[] = [
    {
      chain: new OwnedChain(binary, DNAT_CHAIN),
      rule: dnatRule(target),
      purpose: `redirect of ${target.metadataAddress} to the agent`,
    },
    {
      chain: new OwnedChain(binary, GUARD_CHAIN),
      rule: guardRule(target),
      purpose: `guard for ${target.metadataAddress}`,
    },
  ];
  if (await nodeHasIpv6()) {
    placed.push({
      chain: new OwnedChain(ipv6Binary(binary), GUARD_CHAIN),
      rule: guardRule({ ...target, metadataAddress: IPV6_METADATA_ADDRESS }),
      purpose: `guard for ${IPV6_METADATA_ADDRESS} (the node has IPv6: without it, a pod with an IPv6 address could reach the node's role there)`,
    });
  }
  return placed;
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
function removeTaintWhenReady(
  api: NodeApi,
  nodeName: string,
  taint: TaintSpec,
  ruleInPlace: Observable<boolean>,
  index: LivePodIndex,
  logger: Logger,
): Subscription {
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
    .subscribe((outcome) =>
      logger.info(
        { ...fields, outcome },
        outcome === 'removed'
          ? 'removed the readiness taint: pods can be scheduled here'
          : 'the readiness taint was not on the node',
      ),
    );
}
