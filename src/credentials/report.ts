/** An STS attempt as the audit event that logs and metrics read. */
import type { AuditEventBody } from '../audit/events.js';
import type { StsCallReport } from './sts.js';

export function stsCallEvent({ identity, trigger, attempt, durationMs, error }: StsCallReport): AuditEventBody {
  return {
    type: 'sts.call',
    roleArn: identity.roleArn,
    sessionName: identity.sessionName,
    trigger,
    attempt,
    durationMs,
    outcome: error === undefined ? 'success' : error.throttled ? 'throttled' : 'error',
    error: error?.message,
  };
}
