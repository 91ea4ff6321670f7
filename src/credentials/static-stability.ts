/**
 * Static stability: when STS fails or is slow, credentials still valid are served until their
 * real expiry, even below the usual minimum remaining life, and reported as stale.
 */
import type { Credentials } from '../model/credentials.js';
import type { RoleIdentity } from '../model/role-identity.js';
import type { CredentialSupply } from './supply.js';

interface StaticStabilityOptions {
  /** The last credentials obtained for an identity, if still held. */
  readonly lastKnown: (identity: RoleIdentity) => Credentials | undefined;
  readonly now: () => number;
}

export function staticStability(inner: CredentialSupply, options: StaticStabilityOptions): CredentialSupply {
  return async (identity, request) => {
    try {
      return await inner(identity, request);
    } catch (error) {
      const last = options.lastKnown(identity);
      if (last && last.expiration.getTime() > options.now()) return { credentials: last, freshness: 'stale' };
      throw error;
    }
  };
}
