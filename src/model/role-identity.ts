/** What STS is asked for: the cache key too, so that no two pods ever share a session. */
export interface RoleIdentity {
  readonly roleArn: string;
  readonly externalId: string | undefined;
  readonly sessionName: string;
}

export const identityKey = (identity: RoleIdentity): string =>
  `${identity.roleArn}|${identity.externalId ?? ''}|${identity.sessionName}`;
