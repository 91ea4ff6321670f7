/**
 * Credentials per identity (role ARN, external ID, session name): one STS call however many
 * requests arrive together, and never credentials with less life left than SDKs need.
 */
import type { RoleIdentity } from '../broker/policy.js';
import type { AssumeRole, Credentials } from './sts.js';

export interface CredentialCacheOptions {
  readonly assumeRole: AssumeRole;
  readonly sessionDurationSeconds: number;
  readonly now?: () => number;
}

export interface CachedCredentials {
  readonly credentials: Credentials;
  /** true when no STS call was needed for this request. */
  readonly cached: boolean;
}

export const identityKey = (identity: RoleIdentity): string => `${identity.roleArn}|${identity.externalId ?? ''}|${identity.sessionName}`;

/**
 * botocore treats credentials within 15 minutes (plus jitter) of expiry as expiring and can use
 * them past their real end, so hand out nothing with less than 30 minutes left, or half the
 * session when sessions are shorter than an hour.
 */
export const minimumRemainingMs = (sessionDurationSeconds: number): number => Math.min(30 * 60_000, (sessionDurationSeconds * 1000) / 2);

export class CredentialCache {
  private readonly entries = new Map<string, Credentials>();
  private readonly inFlight = new Map<string, Promise<Credentials>>();
  private readonly now: () => number;
  private readonly minimumRemaining: number;

  constructor(private readonly options: CredentialCacheOptions) {
    this.now = options.now ?? Date.now;
    this.minimumRemaining = minimumRemainingMs(options.sessionDurationSeconds);
  }

  async get(identity: RoleIdentity): Promise<CachedCredentials> {
    const key = identityKey(identity);
    const entry = this.entries.get(key);
    if (entry && this.isFresh(entry)) return { credentials: entry, cached: true };
    return { credentials: await this.fetch(key, identity), cached: false };
  }

  /** Forgets identities no live pod uses any more. */
  evict(identity: RoleIdentity): void {
    this.entries.delete(identityKey(identity));
  }

  size(): number {
    return this.entries.size;
  }

  private isFresh(credentials: Credentials): boolean {
    return credentials.expiration.getTime() - this.now() >= this.minimumRemaining;
  }

  private fetch(key: string, identity: RoleIdentity): Promise<Credentials> {
    const pending = this.inFlight.get(key);
    if (pending) return pending;
    const call = this.options
      .assumeRole(identity, this.options.sessionDurationSeconds)
      .then((credentials) => {
        this.entries.set(key, credentials);
        return credentials;
      })
      .finally(() => this.inFlight.delete(key));
    this.inFlight.set(key, call);
    return call;
  }
}
