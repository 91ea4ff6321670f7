/** One audit event as one line a person reads (the demo and `kube-iam-broker events` print these; the JSON form is for machines). */
import type { AuditEvent } from './events.js';

export function describeEvent(event: AuditEvent): string {
  const who = [event.podIp, event.namespace && event.pod ? `${event.namespace}/${event.pod}` : undefined]
    .filter(Boolean)
    .join(' ');
  return `${event.type.padEnd(17)} ${who.padEnd(24)} ${details(event)}`.trimEnd();
}

function details(event: AuditEvent): string {
  switch (event.type) {
    case 'credential.issued':
      return `role ${event.roleArn} (${event.source}), resolved by ${event.resolvedBy} after ${Math.round(event.waitedMs)} ms, expires ${event.expiration}`;
    case 'credential.denied':
      return `${event.status}: ${event.reason}${repeats(event.count)}`;
    case 'request.throttled':
      return `429: over the per-caller ${LIMIT_TEXT[event.limit]}${repeats(event.count)}`;
    case 'lookup.waited':
      return `waited ${Math.round(event.waitedMs)} ms for the caller's pod (up to ${event.holdMs} ms for ${event.holdClient}), outcome: ${event.outcome}`;
    case 'token.issued':
      return `IMDSv2 token, ttl ${event.ttlSeconds} s`;
    case 'token.refused':
      return `${event.reason}${repeats(event.count)}`;
    case 'pod.indexed':
      return event.previousPod ? `now owns this IP (was ${event.previousPod})` : 'now owns this IP';
    case 'pod.removed':
      return 'no longer owns this IP';
    case 'sts.call':
      return `AssumeRole ${event.roleArn ?? ''} for ${event.sessionName} (${event.trigger}, attempt ${event.attempt}): ${event.outcome} in ${Math.round(event.durationMs)} ms${event.error ? `: ${event.error}` : ''}`;
    case 'node.iptables':
      return `${event.action}: ${event.detail}`;
    case 'node.conntrack':
      return `${event.action} ${event.count}: ${event.detail}`;
  }
}

const LIMIT_TEXT = {
  rate: 'request rate',
  connections: 'connection limit',
  waiting: 'limit of waiting lookups',
} as const;
const repeats = (count: number | undefined): string => (count === undefined ? '' : ` (×${count})`);
