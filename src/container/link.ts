/**
 * The door's address on the node: a dummy link holding the listen host (as EKS Pod Identity's
 * agent does), so pods reach 169.254.170.23 by plain routing through the node. Brought up with
 * `ip` and left in place at exit (a restarted agent takes it over). Nothing here may stop the
 * agent: the metadata door goes on.
 */
import { existsSync } from 'node:fs';
import { isIPv6 } from 'node:net';
import { type ToolResult, runTool, unexpected } from '../node/exec.js';

export type RunIp = (args: readonly string[]) => Promise<ToolResult>;

export const runIp: RunIp = (args) => runTool('ip', args);

export type LinkOutcome = { readonly kind: 'up' } | { readonly kind: 'skipped'; readonly reason: string };

/** Idempotent: an existing link and address are kept. */
export async function bringUpLink(name: string, host: string, ip: RunIp = runIp, hasIpv6 = () => existsSync('/proc/net/if_inet6')): Promise<LinkOutcome> {
  if (isIPv6(host) && !hasIpv6()) return { kind: 'skipped', reason: `the node has no IPv6, so ${host} is not brought up` };
  const run = async (args: readonly string[], tolerated?: RegExp) => {
    const result = await ip(args);
    if (result.code !== 0 && !(tolerated && tolerated.test(result.stderr))) throw unexpected('ip', args, result);
  };
  await run(['link', 'add', name, 'type', 'dummy'], /exists/i);
  await run(['addr', 'replace', `${host}/${isIPv6(host) ? 128 : 32}`, 'dev', name]);
  await run(['link', 'set', name, 'up']);
  return { kind: 'up' };
}
