/**
 * STS AssumeRole with the node's own credentials (the SDK's default chain and settings), and as
 * the innermost layer of credential supply.
 */
import { AssumeRoleCommand, STSClient, STSServiceException } from '@aws-sdk/client-sts';
import type { Credentials } from '../model/credentials.js';
import type { RoleIdentity } from '../model/role-identity.js';
import type { CredentialSupply, Priority, SupplyRequest } from './supply.js';

export type AssumeRole = (identity: RoleIdentity, durationSeconds: number) => Promise<Credentials>;

export class StsError extends Error {
  constructor(
    message: string,
    readonly code: string,
    readonly throttled: boolean,
    readonly retryable: boolean,
  ) {
    super(message);
    this.name = 'StsError';
  }
}

const THROTTLING_CODES = new Set([
  'Throttling',
  'ThrottlingException',
  'RequestLimitExceeded',
  'TooManyRequestsException',
]);

/** STSClient honours AWS_REGION, AWS_ENDPOINT_URL_STS and AWS_STS_REGIONAL_ENDPOINTS; region falls back to the node's. */
export function createStsClient(region: () => Promise<string>): STSClient {
  const fromEnv = process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION;
  // The agent retries and rate-limits on its own; the SDK's retries would hide throttling from it.
  return new STSClient({ region: fromEnv ?? region, maxAttempts: 1 });
}

export function stsAssumeRole(client: STSClient, now: () => Date = () => new Date()): AssumeRole {
  return async (identity, durationSeconds) => {
    let response;
    try {
      response = await client.send(
        new AssumeRoleCommand({
          RoleArn: identity.roleArn,
          RoleSessionName: identity.sessionName,
          ExternalId: identity.externalId,
          DurationSeconds: durationSeconds,
        }),
      );
    } catch (error) {
      throw toStsError(error);
    }
    const credentials = response.Credentials;
    if (
      !credentials?.AccessKeyId ||
      !credentials.SecretAccessKey ||
      !credentials.SessionToken ||
      !credentials.Expiration
    ) {
      throw new StsError('STS AssumeRole returned no credentials', 'EmptyResponse', false, true);
    }
    return {
      accessKeyId: credentials.AccessKeyId,
      secretAccessKey: credentials.SecretAccessKey,
      sessionToken: credentials.SessionToken,
      expiration: credentials.Expiration,
      issuedAt: now(),
      accountId: accountOf(response.AssumedRoleUser?.Arn) ?? accountOf(identity.roleArn) ?? '',
    };
  };
}

const accountOf = (arn: string | undefined): string | undefined => arn?.split(':')[4] || undefined;

function toStsError(error: unknown): StsError {
  if (error instanceof StsError) return error;
  if (error instanceof STSServiceException) {
    const throttled = THROTTLING_CODES.has(error.name) || error.$metadata.httpStatusCode === 429;
    const serverFault = error.$fault === 'server' || (error.$metadata.httpStatusCode ?? 0) >= 500;
    return new StsError(`${error.name}: ${error.message}`, error.name, throttled, throttled || serverFault);
  }
  const named = error as { name?: string; message?: string; code?: string };
  // Anything that is not an answer from STS (refused, reset, timed out) is worth another try.
  return new StsError(named.message ?? String(error), named.code ?? named.name ?? 'NetworkError', false, true);
}

export interface StsCallReport {
  readonly identity: RoleIdentity;
  readonly trigger: Priority;
  /** 0-based: how many AssumeRole calls the same request made before this one. */
  readonly attempt: number;
  readonly durationMs: number;
  readonly error?: StsError;
}

/**
 * STS as a supply: one AssumeRole per call, every failure an StsError, every call reported (the
 * rate-limit wait above is not part of its duration). Retries pass the same request again, which
 * is how the attempts of one request are counted.
 */
export function stsSupply(
  assumeRole: AssumeRole,
  sessionDurationSeconds: number,
  onCall?: (report: StsCallReport) => void,
): CredentialSupply {
  const attempts = new WeakMap<SupplyRequest, number>();
  return async (identity, request) => {
    const attempt = attempts.get(request) ?? 0;
    attempts.set(request, attempt + 1);
    const startedAt = performance.now();
    const report = (error?: StsError) =>
      onCall?.({ identity, trigger: request.priority, attempt, durationMs: performance.now() - startedAt, error });
    try {
      const credentials = await assumeRole(identity, sessionDurationSeconds);
      report();
      return { credentials, freshness: 'miss' };
    } catch (raw) {
      const error = toStsError(raw);
      report(error);
      throw error;
    }
  };
}
