/**
 * One caller, one decision: the lookup (a subscription owned by the request) followed by the role
 * policy. The metadata server asks this and nothing else about who a caller is.
 */
import type { SchedulerLike, Subscription } from 'rxjs';
import { type FoundOutcome, type LiveIndex, type TimeoutOutcome, lookup } from './lookup.js';
import { type Grant, type Refusal, type RolePolicy, grantFor } from './policy.js';

export interface BrokerOptions {
  readonly index: LiveIndex;
  readonly policy: RolePolicy;
  readonly needsNamespace: boolean;
  /** The configured or discovered base ARN; undefined until discovery succeeds. */
  readonly baseRoleArn: () => string | undefined;
  readonly scheduler?: SchedulerLike;
}

/** identified: the caller's pod (and its namespace where needed) is known. Otherwise the caller is refused. */
export type Identification =
  | { readonly identified: true; readonly outcome: FoundOutcome; readonly grant: Grant }
  | { readonly identified: false; readonly outcome: TimeoutOutcome; readonly grant: Refusal };

export class RequestAborted extends Error {
  constructor() {
    super('the client went away before its pod was known');
    this.name = 'RequestAborted';
  }
}

export class Broker {
  constructor(private readonly options: BrokerOptions) {}

  /** Resolves when the caller is known or its hold ends; rejects with RequestAborted when the signal fires first. */
  identify(ip: string, holdMs: number, signal: AbortSignal): Promise<Identification> {
    const { index, needsNamespace, scheduler } = this.options;
    return new Promise<Identification>((resolve, reject) => {
      if (signal.aborted) return reject(new RequestAborted());
      let subscription: Subscription | undefined;
      const onAbort = () => {
        subscription?.unsubscribe();
        reject(new RequestAborted());
      };
      signal.addEventListener('abort', onAbort, { once: true });
      subscription = lookup(index, ip, { holdMs, needsNamespace, scheduler }).subscribe({
        next: (outcome) => {
          signal.removeEventListener('abort', onAbort);
          const { policy, baseRoleArn } = this.options;
          resolve(
            outcome.kind === 'found'
              ? { identified: true, outcome, grant: grantFor(outcome, ip, policy, baseRoleArn()) }
              : { identified: false, outcome, grant: grantFor(outcome, ip, policy, baseRoleArn()) },
          );
        },
        error: (error: unknown) => {
          signal.removeEventListener('abort', onAbort);
          reject(error);
        },
      });
    });
  }
}
