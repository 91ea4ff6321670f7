/**
 * `kube-iam-broker node-cleanup`: removes from the node everything the agent installed there. The
 * agent itself leaves its rules behind when it stops (pods must never reach the node's metadata
 * service while no agent runs), so uninstalling is this explicit act, run on every node
 * (k8s/uninstall/). Each thing the agent can install is one NodeArtifact; a new one (a link, a
 * route) is one more entry in nodeArtifacts().
 */
import type { Logger } from 'pino';
import { removeDummyLink } from './dummy-link.js';
import { NodeToolError } from './exec.js';
import { BACKENDS, OWNED_CHAINS, OwnedChain, ipv6Binary } from './iptables.js';

export interface NodeArtifact {
  /** How an operator would recognise it, e.g. `iptables-nft -t nat KUBE-IAM-BROKER`. */
  readonly name: string;
  /** True when it was there and is now gone, false when it was not there. */
  remove(): Promise<boolean>;
}

/**
 * Every artifact the agent may have installed: its chains in both iptables backends and both
 * address families, as the agent's `auto` may have picked either backend on an earlier start, and
 * the container-credentials door's dummy link (BROKER_CONTAINER_LINK) unless that is off.
 */
export function nodeArtifacts(iptablesBinary: string, containerLink: string): NodeArtifact[] {
  const ipv4 = iptablesBinary === 'auto' ? [...BACKENDS] : [iptablesBinary];
  const binaries = ipv4.flatMap((binary) => [binary, ipv6Binary(binary)]);
  const chains = binaries.flatMap((binary) =>
    OWNED_CHAINS.map((place) => chainArtifact(new OwnedChain(binary, place))),
  );
  return containerLink === 'off'
    ? chains
    : [...chains, { name: `ip link ${containerLink}`, remove: () => removeDummyLink(containerLink) }];
}

function chainArtifact(chain: OwnedChain): NodeArtifact {
  return {
    name: `${chain.binary} -t ${chain.place.table} ${chain.place.chain}`,
    async remove() {
      try {
        return await chain.remove();
      } catch (error) {
        // A backend or address family this image or kernel does not have holds nothing of ours.
        if (error instanceof NodeToolError && /not found/.test(error.message)) return false;
        throw error;
      }
    },
  };
}

/** Removes every artifact, logging one line each; resolves with how many could not be removed. */
export async function cleanNode(artifacts: readonly NodeArtifact[], logger: Logger): Promise<number> {
  let failed = 0;
  for (const artifact of artifacts) {
    try {
      const outcome = (await artifact.remove()) ? 'removed' : 'absent';
      logger.info(
        { artifact: artifact.name, outcome },
        outcome === 'removed' ? 'removed from the node' : 'not on the node',
      );
    } catch (error) {
      failed++;
      logger.error({ artifact: artifact.name, err: String(error) }, 'cannot remove it from the node');
    }
  }
  return failed;
}
