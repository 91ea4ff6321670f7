/** The instance-metadata service's IPv6 endpoint, and whether the node can reach it at all. */
import { readFile } from 'node:fs/promises';

/** EC2's IPv6 metadata address (when the instance enables HttpProtocolIpv6). */
export const IPV6_METADATA_ADDRESS = 'fd00:ec2::254';

/**
 * True when the node's kernel has IPv6 addresses (with hostNetwork, the agent sees the node's).
 * A kernel booted with ipv6.disable=1 has no /proc/net/if_inet6; one with IPv6 disabled on every
 * interface has an empty one. Neither can carry a pod's packet to fd00:ec2::254.
 */
export async function nodeHasIpv6(addressTable = '/proc/net/if_inet6'): Promise<boolean> {
  try {
    return (await readFile(addressTable, 'utf8')).trim().length > 0;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw error;
  }
}
