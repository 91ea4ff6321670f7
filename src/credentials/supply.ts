/**
 * The one seam of credential supply: every layer (STS, retries, rate limit, cache, refresh ahead,
 * deadline, static stability) takes a CredentialSupply and returns one, so each is small and
 * tested alone, and every door (instance metadata, container credentials) asks the same way.
 */
import type { Credentials } from '../model/credentials.js';
import type { RoleIdentity } from '../model/role-identity.js';

/** client: a caller holds a request open for the answer; background: nobody waits (refresh ahead). */
export type Priority = 'client' | 'background';

/**
 * One request for credentials, passed unchanged through every layer, so that a layer below can
 * see what a layer above changed: a client joining a background fetch raises its priority.
 */
export interface SupplyRequest {
  priority: Priority;
  /** How long the caller waits at most; the fetch itself goes on in the background. */
  readonly deadlineMs?: number;
  /** Ask STS even when fresh credentials are cached (refresh ahead). */
  readonly renew?: boolean;
}

/** hit: cached and fresh; miss: fetched for this request; stale: STS failed or was slow, served below the usual minimum life. */
type Freshness = 'hit' | 'miss' | 'stale';

export interface Supplied {
  readonly credentials: Credentials;
  readonly freshness: Freshness;
}

export type CredentialSupply = (identity: RoleIdentity, request: SupplyRequest) => Promise<Supplied>;

/** A door's request: a client waiting at most `deadlineMs` (no bound when absent). */
export const clientRequest = (deadlineMs?: number): SupplyRequest => ({ priority: 'client', deadlineMs });

export class SupplyStopped extends Error {
  constructor() {
    super('the credential supply was stopped');
    this.name = 'SupplyStopped';
  }
}
