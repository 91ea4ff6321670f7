/**
 * The nat rule that sends pods' metadata traffic to the agent, kept in a chain of its own.
 *
 * PREROUTING gets one jump, always spelled the same, so `iptables -C` finds it across restarts,
 * crashes and configuration changes: a second start never adds a second jump. The DNAT itself
 * lives in KUBE-IAM-BROKER, which is rewritten whole when it is not exactly what this
 * configuration wants, so a changed port or interface never leaves an old rule matching first.
 * Both carry a comment so an operator reading `iptables -t nat -S` knows whose they are.
 */
import { NodeToolError, runTool, unexpected } from './exec.js';

export const CHAIN = 'KUBE-IAM-BROKER';
const JUMP_COMMENT = 'kube-iam-broker: pod metadata traffic';
const DNAT_COMMENT = 'kube-iam-broker: metadata to agent';
/** Wait this long for the xtables lock that kube-proxy and the CNI also take. */
const LOCK_WAIT_SECONDS = '5';
/** Jumps deleted at most this many times on removal: enough for duplicates left by anything. */
const MAX_JUMPS_REMOVED = 10;

export interface DnatTarget {
  /** The metadata address and port pods connect to (169.254.169.254:80 on EC2). */
  readonly metadataAddress: string;
  readonly metadataPort: number;
  /** Where the agent listens, as pods reach it (the node's IP, from the downward API). */
  readonly agentAddress: string;
  readonly agentPort: number;
  /** Interfaces pods' traffic arrives on: a name, a prefix with `+` (cali+, eni+), `!` negates. */
  readonly hostInterface: string;
}

/** What ensure() found: the rule was already there, or it had to be (re)written. */
export type EnsureOutcome = 'in-place' | 'installed';

export class DnatRule {
  constructor(
    readonly binary: string,
    readonly target: DnatTarget,
  ) {}

  /** The DNAT rule as a command line, for logs and audit. */
  describe(): string {
    return `${this.binary} -t nat -A ${CHAIN} ${this.dnatSpec().join(' ')}`;
  }

  async isInPlace(): Promise<boolean> {
    const [jump, dnat] = await Promise.all([this.exists('PREROUTING', jumpSpec()), this.exists(CHAIN, this.dnatSpec())]);
    return jump && dnat;
  }

  /** Installs what is missing; safe to call at any time, any number of times. */
  async ensure(): Promise<EnsureOutcome> {
    const jumpPresent = await this.exists('PREROUTING', jumpSpec());
    if (jumpPresent && (await this.exists(CHAIN, this.dnatSpec()))) return 'in-place';
    const created = await this.iptables(['-N', CHAIN]);
    if (created.code !== 0 && !/exists/i.test(created.stderr)) throw unexpected(this.binary, ['-N', CHAIN], created);
    await this.must(['-F', CHAIN]);
    await this.must(['-A', CHAIN, ...this.dnatSpec()]);
    // First in PREROUTING, so no other DNAT rule of the node claims the metadata address before ours.
    if (!jumpPresent) await this.must(['-I', 'PREROUTING', '1', ...jumpSpec()]);
    return 'installed';
  }

  /** Removes the jump (every copy) and the chain; true when there was anything to remove. */
  async remove(): Promise<boolean> {
    let removedAny = false;
    for (let i = 0; i < MAX_JUMPS_REMOVED && (await this.iptables(['-D', 'PREROUTING', ...jumpSpec()])).code === 0; i++) removedAny = true;
    if ((await this.iptables(['-F', CHAIN])).code === 0) {
      await this.must(['-X', CHAIN]);
      removedAny = true;
    }
    return removedAny;
  }

  private dnatSpec(): string[] {
    const { metadataAddress, metadataPort, agentAddress, agentPort, hostInterface } = this.target;
    const negated = hostInterface.startsWith('!');
    const interfaceMatch = negated ? ['!', '-i', hostInterface.slice(1)] : ['-i', hostInterface];
    return [
      '-d', `${metadataAddress}/32`, ...interfaceMatch, '-p', 'tcp', '--dport', String(metadataPort),
      '-m', 'comment', '--comment', DNAT_COMMENT,
      '-j', 'DNAT', '--to-destination', `${agentAddress}:${agentPort}`,
    ];
  }

  /** `-C` answers 0 when the rule exists and non-zero when it (or its chain) does not. */
  private async exists(chain: string, spec: readonly string[]): Promise<boolean> {
    return (await this.iptables(['-C', chain, ...spec])).code === 0;
  }

  private async must(args: string[]): Promise<void> {
    const result = await this.iptables(args);
    if (result.code !== 0) throw unexpected(this.binary, ['-t', 'nat', ...args], result);
  }

  private iptables(args: readonly string[]) {
    return runTool(this.binary, ['-w', LOCK_WAIT_SECONDS, '-t', 'nat', ...args]);
  }
}

function jumpSpec(): string[] {
  return ['-m', 'comment', '--comment', JUMP_COMMENT, '-j', CHAIN];
}

/** Chains kubelet and kube-proxy create in the backend they use (the same hint kube-proxy's iptables-wrapper reads). */
const KUBE_HINT_CHAINS = /^-N (KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)$/m;
const BACKENDS = ['iptables-legacy', 'iptables-nft'] as const;

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
      const [mangle, nat] = await Promise.all([runTool(binary, ['-w', LOCK_WAIT_SECONDS, '-t', 'mangle', '-S']), runTool(binary, ['-w', LOCK_WAIT_SECONDS, '-t', 'nat', '-S'])]);
      if (mangle.code !== 0 || nat.code !== 0) continue;
      seen.push({ binary, hinted: KUBE_HINT_CHAINS.test(mangle.stdout), natRules: nat.stdout.split('\n').filter((line) => line.startsWith('-A ')).length });
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
