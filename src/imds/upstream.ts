/**
 * The node's real metadata service: allow-listed paths are proxied to it, and the agent asks it
 * which account and region the node is in. The agent holds its own IMDSv2 token for it: a pod's
 * token is ours, never forwarded.
 */
import { Agent, request } from 'undici';
import { z } from 'zod';

const TOKEN_TTL_SECONDS = 21_600;
/** Renew well before the upstream token expires. */
const TOKEN_RENEW_MARGIN_MS = 60_000;

export interface UpstreamResponse {
  readonly status: number;
  readonly contentType: string | undefined;
  readonly body: Buffer;
}

export interface NodeIdentity {
  readonly accountId: string;
  readonly partition: string;
}

const IamInfo = z.object({
  Code: z.literal('Success'),
  InstanceProfileArn: z.string().regex(/^arn:aws[a-z-]*:iam::\d{12}:instance-profile\//),
});

export class Upstream {
  private readonly dispatcher = new Agent({
    connect: { timeout: 1000 },
    headersTimeout: 2000,
    bodyTimeout: 2000,
    keepAliveTimeout: 10_000,
  });
  private token: { value: string | undefined; renewAt: number } | undefined;

  constructor(readonly baseUrl: string) {}

  async get(path: string): Promise<UpstreamResponse> {
    const token = await this.sessionToken();
    const response = await request(`${this.baseUrl}${path}`, {
      method: 'GET',
      dispatcher: this.dispatcher,
      headers: token ? { 'x-aws-ec2-metadata-token': token } : {},
    });
    const body = Buffer.from(await response.body.arrayBuffer());
    if (response.statusCode === 401) this.token = undefined;
    const contentType = response.headers['content-type'];
    return {
      status: response.statusCode,
      contentType: Array.isArray(contentType) ? contentType[0] : contentType,
      body,
    };
  }

  /** The node's account and partition, from its instance profile (kube2iam's --auto-discover-base-arn). */
  async nodeIdentity(): Promise<NodeIdentity> {
    const info = await this.get('/latest/meta-data/iam/info');
    if (info.status !== 200) throw new Error(`upstream iam/info answered ${info.status}`);
    const parsed = IamInfo.safeParse(JSON.parse(info.body.toString('utf8')));
    if (!parsed.success)
      throw new Error(`upstream iam/info is not an instance profile document: ${parsed.error.issues[0]?.message}`);
    const [, partition, , , accountId] = parsed.data.InstanceProfileArn.split(':');
    return { accountId: accountId as string, partition: partition as string };
  }

  async region(): Promise<string> {
    const response = await this.get('/latest/meta-data/placement/region');
    const region = response.body.toString('utf8').trim();
    if (response.status !== 200 || !/^[a-z]{2}(-[a-z]+)+-\d+$/.test(region))
      throw new Error(`upstream placement/region answered ${response.status}`);
    return region;
  }

  close(): Promise<void> {
    return this.dispatcher.close();
  }

  /** An upstream IMDSv2 token, or undefined where the upstream only speaks IMDSv1. */
  private async sessionToken(): Promise<string | undefined> {
    if (this.token && this.token.renewAt > Date.now()) return this.token.value;
    const response = await request(`${this.baseUrl}/latest/api/token`, {
      method: 'PUT',
      dispatcher: this.dispatcher,
      headers: { 'x-aws-ec2-metadata-token-ttl-seconds': String(TOKEN_TTL_SECONDS) },
    });
    const text = await response.body.text();
    const value = response.statusCode === 200 ? text : undefined;
    this.token = {
      value,
      renewAt: Date.now() + (value ? TOKEN_TTL_SECONDS * 1000 - TOKEN_RENEW_MARGIN_MS : TOKEN_RENEW_MARGIN_MS),
    };
    return value;
  }
}

/** Retries a discovery until it succeeds, sharing one attempt between concurrent callers. */
export function memoizeUntilSuccess<T>(discover: () => Promise<T>): () => Promise<T> {
  let attempt: Promise<T> | undefined;
  return () => {
    attempt ??= discover().catch((error: unknown) => {
      attempt = undefined;
      throw error;
    });
    return attempt;
  };
}
