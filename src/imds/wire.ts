/** The exact bodies real SDKs parse (see imds-protocol.md); the one place these formats live. */
import { createHash } from 'node:crypto';
import type { Credentials } from '../model/credentials.js';

/** YYYY-MM-DDTHH:MM:SSZ: botocore's expiry parsing expects no fractional seconds. */
export const imdsTimestamp = (date: Date): string => date.toISOString().replace(/\.\d{3}Z$/, 'Z');

export function credentialsBody(credentials: Credentials): string {
  return JSON.stringify(credentialFields(credentials));
}

/** security-credentials-extended: the same document plus the account (Java SDK v2 reads it first). */
export function extendedCredentialsBody(credentials: Credentials): string {
  return JSON.stringify({ ...credentialFields(credentials), AccountId: credentials.accountId });
}

function credentialFields(credentials: Credentials) {
  return {
    Code: 'Success',
    LastUpdated: imdsTimestamp(credentials.issuedAt),
    Type: 'AWS-HMAC',
    AccessKeyId: credentials.accessKeyId,
    SecretAccessKey: credentials.secretAccessKey,
    Token: credentials.sessionToken,
    Expiration: imdsTimestamp(credentials.expiration),
  };
}

/** iam/info describes the pod's role as if it were the instance profile, never the node's. */
export function iamInfoBody(roleArn: string, now: Date): string {
  const digest = createHash('sha256')
    .update(roleArn)
    .digest('hex')
    .toUpperCase()
    .replace(/[^A-Z0-9]/g, '');
  return JSON.stringify({
    Code: 'Success',
    LastUpdated: imdsTimestamp(now),
    InstanceProfileArn: roleArn.replace(':role/', ':instance-profile/'),
    InstanceProfileId: `AIPA${digest.slice(0, 17)}`,
  });
}

export const IAM_LISTING = 'info\nsecurity-credentials/';
