/** The container-credentials provider's formats, as the SDKs parse them (ECS and EKS Pod Identity agents answer the same). */
import type { Credentials } from '../model/credentials.js';
import { imdsTimestamp } from '../imds/wire.js';

export const CREDENTIALS_PATH = '/v1/credentials';

export function containerCredentialsBody(credentials: Credentials): string {
  return JSON.stringify({
    AccessKeyId: credentials.accessKeyId,
    SecretAccessKey: credentials.secretAccessKey,
    Token: credentials.sessionToken,
    Expiration: imdsTimestamp(credentials.expiration),
    AccountId: credentials.accountId,
  });
}

/** The SDKs show Code and Message of an error document to their user. */
export function containerErrorBody(status: number, message: string): string {
  return JSON.stringify({ Code: ERROR_CODES[status] ?? 'InternalError', Message: message });
}

const ERROR_CODES: Readonly<Record<number, string>> = {
  400: 'InvalidToken',
  403: 'AccessDenied',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  429: 'TooManyRequests',
  500: 'InternalError',
  503: 'ServiceUnavailable',
};

/** The hosts a request may name: the listen address itself, with or without its port (no DNS rebinding). */
export function allowedHosts(listenHost: string, port: number): ReadonlySet<string> {
  const host = listenHost.includes(':') && !listenHost.startsWith('[') ? `[${listenHost}]` : listenHost;
  return new Set([host, `${host}:${port}`].map((value) => value.toLowerCase()));
}
