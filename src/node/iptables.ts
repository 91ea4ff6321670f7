/**
 * The agent's iptables rules, each kept in a chain of its own.
 *
 * A built-in chain gets one jump to ours, always spelled the same, so `iptables -C` finds it
 * across restarts, crashes and configuration changes: a second start never adds a second jump.
 * Our chain holds exactly one rule. When it is not exactly the rule this configuration wants, the
 * new rule is inserted first and the others are deleted after it, so the chain is never empty and
 * pods' traffic never falls through to the node's metadata service while it is rewritten. Every
 * jump carries a comment so an operator reading `iptables -S` knows whose it is.
 */
import { NodeToolError, runTool, unexpected } from './exec.js';

/** Wait this long for the xtables lock that kube-proxy and the CNI also take. */
const LOCK_WAIT_SECONDS = '5';
/** Jumps and stray rules deleted at most this many times: enough for duplicates left by anything. */
const MAX_DELETIONS = 10;

/** Where one of our chains lives and what jumps to it: all node-cleanup needs to remove it. */
export interface ChainPlace {
  readonly table: 'nat' | 'filter';
  readonly chain: string;
  /** Built-in chains that jump to ours, first thing. */
  readonly hooks: readonly string[];
  readonly jumpComment: string;
}

/** The metadata service's redirect to the agent (nat PREROUTING). */
export const DNAT_CHAIN: ChainPlace = {
  table: 'nat',
  chain: 'KUBE-IAM-BROKER',
  hooks: ['PREROUTING'],
  jumpComment: 'kube-iam-broker: pod metadata traffic',
};
/**
 * The guard: pods' packets still addressed to the metadata service after PREROUTING (the redirect
 * is gone, or the connection predates it) are answered with a TCP reset instead of reaching it.
 * INPUT where the service is a local address, FORWARD where it is routed (EC2).
 */
export const GUARD_CHAIN: ChainPlace = {
  table: 'filter',
  chain: 'KUBE-IAM-BROKER-GUARD',
  hooks: ['INPUT', 'FORWARD'],
  jumpComment: 'kube-iam-broker: pod metadata guard',
};
export const OWNED_CHAINS: readonly ChainPlace[] = [GUARD_CHAIN, DNAT_CHAIN];

/** The metadata service as pods address it, and the interfaces their traffic arrives on. */
export interface MetadataTraffic {
  /** 169.254.169.254 (IPv4) or fd00:ec2::254 (IPv6). */
  readonly metadataAddress: string;
  readonly metadataPort: number;
  /** Interfaces pods' traffic arrives on: a name, a prefix with `+` (cali+, eni+), `!` negates. */
  readonly hostInterface: string;
}

export interface DnatTarget extends MetadataTraffic {
  /** Where the agent listens, as pods reach it (the node's IP, from the downward API). */
  readonly agentAddress: string;
  readonly agentPort: number;
}

/** What ensure() found: the rule was already there, or it had to be (re)written. */
export type EnsureOutcome = 'in-place' | 'installed';

export function dnatRule(target: DnatTarget): readonly string[] {
  return [
    ...trafficMatch(target),
    '-m',
    'comment',
    '--comment',
    'kube-iam-broker: metadata to agent',
    '-j',
    'DNAT',
    '--to-destination',
    `${target.agentAddress}:${target.agentPort}`,
  ];
}

export function guardRule(traffic: MetadataTraffic): readonly string[] {
  return [
    ...trafficMatch(traffic),
    '-m',
    'comment',
    '--comment',
    'kube-iam-broker: no pod reaches the node metadata service',
    '-j',
    'REJECT',
    '--reject-with',
    'tcp-reset',
  ];
}

function trafficMatch({ metadataAddress, metadataPort, hostInterface }: MetadataTraffic): string[] {
  const negated = hostInterface.startsWith('!');
  const interfaceMatch = negated ? ['!', '-i', hostInterface.slice(1)] : ['-i', hostInterface];
  const prefix = metadataAddress.includes(':') ? 128 : 32;
  return ['-d', `${metadataAddress}/${prefix}`, ...interfaceMatch, '-p', 'tcp', '--dport', String(metadataPort)];
}

/** One of our chains in one iptables binary (a backend and an address family). */
export class OwnedChain {
  constructor(
    readonly binary: string,
    readonly place: ChainPlace,
  ) {}

  /** Installs what is missing or different; safe to call at any time, any number of times. */
  async ensure(rule: readonly string[]): Promise<EnsureOutcome> {
    const { chain, hooks } = this.place;
    const jumpsPresent = await Promise.all(hooks.map((hook) => this.exists(hook, this.jumpSpec())));
    const rulePresent = await this.exists(chain, rule);
    const ruleAlone = rulePresent && (await this.ruleCount()) === 1;
    if (ruleAlone && jumpsPresent.every(Boolean)) return 'in-place';
    if (!ruleAlone) {
      const created = await this.iptables(['-N', chain]);
      if (created.code !== 0 && !/exists/i.test(created.stderr)) throw this.unexpected(['-N', chain], created);
      await this.must(['-I', chain, '1', ...rule]);
      for (let i = 0; i < MAX_DELETIONS && (await this.ruleCount()) > 1; i++) await this.must(['-D', chain, '2']);
    }
    // First in each hook, so no other rule of the node decides on the metadata traffic before ours.
    for (const [i, hook] of hooks.entries())
      if (!jumpsPresent[i]) await this.must(['-I', hook, '1', ...this.jumpSpec()]);
    return 'installed';
  }

  /** Removes the jumps (every copy) and the chain; true when there was anything to remove. */
  async remove(): Promise<boolean> {
    let removedAny = false;
    for (const hook of this.place.hooks) {
      for (let i = 0; i < MAX_DELETIONS && (await this.iptables(['-D', hook, ...this.jumpSpec()])).code === 0; i++)
        removedAny = true;
    }
    if ((await this.iptables(['-F', this.place.chain])).code === 0) {
      await this.must(['-X', this.place.chain]);
      removedAny = true;
    }
    return removedAny;
  }

  /** The rule as a command line, for logs and audit. */
  describe(rule: readonly string[]): string {
    return `${this.binary} -t ${this.place.table} -A ${this.place.chain} ${rule.join(' ')}`;
  }

  private jumpSpec(): string[] {
    return ['-m', 'comment', '--comment', this.place.jumpComment, '-j', this.place.chain];
  }

  private async ruleCount(): Promise<number> {
    const listed = await this.iptables(['-S', this.place.chain]);
    return listed.code === 0 ? listed.stdout.split('\n').filter((line) => line.startsWith('-A ')).length : 0;
  }

  /** `-C` answers 0 when the rule exists and non-zero when it (or its chain) does not. */
  private async exists(chain: string, spec: readonly string[]): Promise<boolean> {
    return (await this.iptables(['-C', chain, ...spec])).code === 0;
  }

  private async must(args: string[]): Promise<void> {
    const result = await this.iptables(args);
    if (result.code !== 0) throw this.unexpected(args, result);
  }

  private unexpected(args: readonly string[], result: Awaited<ReturnType<typeof runTool>>): NodeToolError {
    return unexpected(this.binary, ['-t', this.place.table, ...args], result);
  }

  private iptables(args: readonly string[]) {
    return runTool(this.binary, ['-w', LOCK_WAIT_SECONDS, '-t', this.place.table, ...args]);
  }
}

/** iptables-legacy → ip6tables-legacy, /usr/sbin/iptables → /usr/sbin/ip6tables: the same backend for IPv6. */
export function ipv6Binary(binary: string): string {
  return binary.replace(/iptables(?=[^/]*$)/, 'ip6tables');
}

/** Chains kubelet and kube-proxy create in the backend they use (the same hint kube-proxy's iptables-wrapper reads). */
const KUBE_HINT_CHAINS = /^-N (KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)$/m;
export const BACKENDS = ['iptables-legacy', 'iptables-nft'] as const;

/**
 * The iptables binary to use. `auto` picks the backend the node already uses: the one where
 * kubelet left its hint chains, else the one holding more nat rules, else plain `iptables`
 * (the distribution's default). Writing to the other backend would install a rule the node's
 * packets may never traverse in the intended order.
 */
export async function resolveIptablesBinary(setting: string): Promise<string> {
  if (setting !== 'auto') return setting;
  const seen: Array<{ binary: string; hinted: boolean; natRules: number }> = [];
  for (const binary of BACKENDS) {
    try {
      const [mangle, nat] = await Promise.all([
        runTool(binary, ['-w', LOCK_WAIT_SECONDS, '-t', 'mangle', '-S']),
        runTool(binary, ['-w', LOCK_WAIT_SECONDS, '-t', 'nat', '-S']),
      ]);
      if (mangle.code !== 0 || nat.code !== 0) continue;
      seen.push({
        binary,
        hinted: KUBE_HINT_CHAINS.test(mangle.stdout),
        natRules: nat.stdout.split('\n').filter((line) => line.startsWith('-A ')).length,
      });
    } catch (error) {
      // A backend this image does not ship cannot be the node's.
      if (!(error instanceof NodeToolError && /not found/.test(error.message))) throw error;
    }
  }
  const hinted = seen.filter((backend) => backend.hinted);
  if (hinted.length === 1) return (hinted[0] as (typeof seen)[number]).binary;
  const [most, next] = [...seen].sort((a, b) => b.natRules - a.natRules);
  return most && most.natRules > (next?.natRules ?? 0) ? most.binary : 'iptables';
}
