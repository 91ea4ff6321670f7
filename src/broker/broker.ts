/**
 * One caller, one decision: the lookup (a subscription owned by the request) followed by the role
 * policy. The metadata server asks this and nothing else about who a caller is.
 */
import type { SchedulerLike, Subscription } from 'rxjs';
import { type LiveIndex, type LookupOutcome, lookup } from './lookup.js';
import { type Grant, type RolePolicy, grantFor } from './policy.js';

export interface BrokerOptions {
  readonly index: LiveIndex;
  readonly policy: RolePolicy;
  readonly graceWindowMs: number;
  readonly needsNamespace: boolean;
  /** The configured or discovered base ARN; undefined until discovery succeeds. */
  readonly baseRoleArn: () => string | undefined;
  readonly scheduler?: SchedulerLike;
}

export interface Identification {
  readonly outcome: LookupOutcome;
  readonly grant: Grant;
}

export class RequestAborted extends Error {
  constructor() {
    super('the client went away before its pod was known');
    this.name = 'RequestAborted';
  }
}

export class Broker {
  constructor(private readonly options: BrokerOptions) {}

  /** Resolves when the caller is known or the grace window ends; rejects with RequestAborted when the signal fires first. */
  identify(ip: string, signal: AbortSignal): Promise<Identification> {
    const { index, graceWindowMs, needsNamespace, scheduler } = this.options;
    return new Promise<Identification>((resolve, reject) => {
      if (signal.aborted) return reject(new RequestAborted());
      let subscription: Subscription | undefined;
      const onAbort = () => {
        subscription?.unsubscribe();
        reject(new RequestAborted());
      };
      signal.addEventListener('abort', onAbort, { once: true });
      subscription = lookup(index, ip, { graceWindowMs, needsNamespace, scheduler }).subscribe({
        next: (outcome) => {
          signal.removeEventListener('abort', onAbort);
          resolve({ outcome, grant: grantFor(outcome, ip, this.options.policy, this.options.baseRoleArn()) });
        },
        error: (error: unknown) => {
          signal.removeEventListener('abort', onAbort);
          reject(error);
        },
      });
    });
  }
}
