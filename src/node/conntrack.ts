/**
 * Connections to the metadata service that were opened before the DNAT rule existed stay on
 * their old destination: conntrack decided their NAT (none) at their first packet. Deleting
 * their entries makes the next packet of each start a new entry, which the rule now sends to
 * the agent; the agent knows nothing of that connection and resets it, and the client
 * reconnects through the rule (the fix aad-pod-identity adopted; kiam #284).
 */
import { runTool, unexpected } from './exec.js';

const DELETED = /(\d+) flow entries have been deleted/;

/**
 * Deletes the TCP entries whose original destination is the metadata address and port and
 * whose replies still come from it, i.e. connections the rule has not redirected. Connections
 * already going to the agent (replies from the agent's address) are left alone. Returns how
 * many entries were deleted.
 */
export async function dropUnredirectedConnections(metadataAddress: string, metadataPort: number, binary = 'conntrack'): Promise<number> {
  const args = ['-D', '-p', 'tcp', '--orig-dst', metadataAddress, '--orig-port-dst', String(metadataPort), '--reply-src', metadataAddress];
  const result = await runTool(binary, args);
  const deleted = DELETED.exec(result.stderr);
  // conntrack exits 1 when nothing matched; "0 flow entries" is the normal case on a quiet node.
  if (deleted && (result.code === 0 || (result.code === 1 && deleted[1] === '0'))) return Number(deleted[1]);
  throw unexpected(binary, args, result);
}
