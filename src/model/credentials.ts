/** Temporary credentials for one role session, as every door answers them. */
export interface Credentials {
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly sessionToken: string;
  readonly expiration: Date;
  readonly issuedAt: Date;
  /** From the assumed-role ARN; served by the extended credential path. */
  readonly accountId: string;
}
