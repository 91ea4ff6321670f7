/**
 * The container-credentials door's address on the node: a dummy link holding the listen host (as
 * EKS Pod Identity's agent does), so pods reach 169.254.170.23 by plain routing through the node.
 * Brought up with `ip` and left in place at exit (a restarted agent takes it over); node-cleanup
 * removes it. Nothing here may stop the agent: the metadata door goes on.
 */
import { existsSync } from 'node:fs';
import { isIPv6 } from 'node:net';
import { type ToolResult, runTool, unexpected } from './exec.js';

export type RunIp = (args: readonly string[]) => Promise<ToolResult>;

export const runIp: RunIp = (args) => runTool('ip', args);

export type LinkOutcome = { readonly kind: 'up' } | { readonly kind: 'skipped'; readonly reason: string };

/** Idempotent: an existing link and address are kept. */
export async function bringUpLink(
  name: string,
  host: string,
  ip: RunIp = runIp,
  hasIpv6 = () => existsSync('/proc/net/if_inet6'),
): Promise<LinkOutcome> {
  if (isIPv6(host) && !hasIpv6())
    return { kind: 'skipped', reason: `the node has no IPv6, so ${host} is not brought up` };
  const run = async (args: readonly string[], tolerated?: RegExp) => {
    const result = await ip(args);
    if (result.code !== 0 && !(tolerated && tolerated.test(result.stderr))) throw unexpected('ip', args, result);
  };
  await run(['link', 'add', name, 'type', 'dummy'], /exists/i);
  await run(['addr', 'replace', `${host}/${isIPv6(host) ? 128 : 32}`, 'dev', name]);
  await run(['link', 'set', name, 'up']);
  return { kind: 'up' };
}

/** For node-cleanup: true when our dummy link was there and is gone. Any other kind of link by that name is not ours to delete. */
export async function removeDummyLink(name: string, ip: RunIp = runIp): Promise<boolean> {
  const shown = await ip(['-d', 'link', 'show', name]);
  if (shown.code !== 0) {
    if (/does not exist|Cannot find device/i.test(shown.stderr)) return false;
    throw unexpected('ip', ['-d', 'link', 'show', name], shown);
  }
  if (!/\bdummy\b/.test(shown.stdout))
    throw new Error(
      `link ${name} is not a dummy link: not removing it (set BROKER_CONTAINER_LINK to the agent's link)`,
    );
  const removed = await ip(['link', 'del', name]);
  if (removed.code !== 0) throw unexpected('ip', ['link', 'del', name], removed);
  return true;
}
