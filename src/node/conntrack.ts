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
 * Deletes the TCP entries of connections to the metadata address and port that the rule has
 * not redirected, and returns how many there were:
 * - original destination the metadata address, replies still from it (connections already
 *   going to the agent have replies from the agent's address and are left alone);
 * - original source the metadata address and port: an entry re-created, mid-stream, by the
 *   service's reply to a request in flight while the first kind was deleted. It would carry the
 *   client's next packets as replies, past the rule, for as long as the connection lives.
 */
export async function dropUnredirectedConnections(
  metadataAddress: string,
  metadataPort: number,
  binary = 'conntrack',
): Promise<number> {
  const port = String(metadataPort);
  const toService = await deleteEntries(binary, [
    '--orig-dst',
    metadataAddress,
    '--orig-port-dst',
    port,
    '--reply-src',
    metadataAddress,
  ]);
  const fromServiceReplies = await deleteEntries(binary, ['--orig-src', metadataAddress, '--orig-port-src', port]);
  return toService + fromServiceReplies;
}

async function deleteEntries(binary: string, filter: readonly string[]): Promise<number> {
  const args = ['-D', '-p', 'tcp', ...filter];
  const result = await runTool(binary, args);
  const deleted = DELETED.exec(result.stderr);
  // conntrack exits 1 when nothing matched; "0 flow entries" is the normal case on a quiet node.
  if (deleted && (result.code === 0 || (result.code === 1 && deleted[1] === '0'))) return Number(deleted[1]);
  throw unexpected(binary, args, result);
}
