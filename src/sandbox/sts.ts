/**
 * A local stand-in for AWS STS, small enough to embed in the demo: AssumeRole over the real STS
 * Query protocol (form-encoded POST in, XML out), so the unmodified @aws-sdk/client-sts talks to
 * it through AWS_ENDPOINT_URL_STS. It issues random credentials that are good for nothing else,
 * records every call, and does not verify signatures: it is a wire-level fake, not a security boundary.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { type IncomingMessage, type ServerResponse, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { z } from 'zod';
import { readBody } from '../http/body.js';

const STS_NAMESPACE = 'https://sts.amazonaws.com/doc/2011-06-15/';
const MAX_BODY_BYTES = 64 * 1024;
/** Kept so a long-running demo does not grow without bound. */
const MAX_RECORDED_CALLS = 1_000;

/** The AssumeRole parameters as STS validates them (the subset the broker sends). */
const AssumeRoleParameters = z.object({
  RoleArn: z.string().regex(/^arn:aws[a-z-]*:iam::\d{12}:role\/[\w+=,.@/-]{1,512}$/, 'RoleArn must be a role ARN'),
  RoleSessionName: z.string().regex(/^[\w+=,.@-]{2,64}$/, 'RoleSessionName must be 2 to 64 characters of [\\w+=,.@-]'),
  DurationSeconds: z
    .string()
    .regex(/^\d+$/)
    .transform(Number)
    .pipe(z.number().int().min(900).max(43_200))
    .default(3600),
  ExternalId: z
    .string()
    .regex(/^[\w+=,.@:/-]{2,1224}$/)
    .optional(),
});

export interface AssumeRoleCall {
  readonly roleArn: string;
  readonly sessionName: string;
  readonly externalId: string | undefined;
  readonly durationSeconds: number;
  readonly accessKeyId: string;
  readonly at: Date;
}

export class StsStandIn {
  readonly calls: AssumeRoleCall[] = [];
  private readonly server = createServer((req, res) => void this.handle(req, res));
  private port = 0;

  private constructor() {}

  /** Listens on a free port of 127.0.0.1. */
  static async start(): Promise<StsStandIn> {
    const standIn = new StsStandIn();
    await new Promise<void>((resolve, reject) => {
      standIn.server.once('error', reject);
      standIn.server.listen(0, '127.0.0.1', () => resolve());
    });
    standIn.port = (standIn.server.address() as AddressInfo).port;
    return standIn;
  }

  get endpoint(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  stop(): Promise<void> {
    return new Promise((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const requestId = randomUUID();
    let form: URLSearchParams;
    try {
      if (req.method !== 'POST')
        return sendError(res, 405, 'InvalidAction', `method ${req.method} is not supported; STS takes POST`, requestId);
      form = new URLSearchParams(await readBody(req, MAX_BODY_BYTES, () => new Error('request body too large')));
    } catch (error) {
      return sendError(res, 400, 'ValidationError', (error as Error).message, requestId);
    }
    const action = form.get('Action');
    if (action !== 'AssumeRole')
      return sendError(
        res,
        400,
        'InvalidAction',
        `Could not find operation ${action ?? '(none)'} for version ${form.get('Version') ?? '(none)'}`,
        requestId,
      );
    const parsed = AssumeRoleParameters.safeParse(Object.fromEntries(form));
    if (!parsed.success)
      return sendError(
        res,
        400,
        'ValidationError',
        parsed.error.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`).join('; '),
        requestId,
      );
    sendXml(res, 200, this.assumeRole(parsed.data, requestId));
  }

  private assumeRole(parameters: z.output<typeof AssumeRoleParameters>, requestId: string): string {
    const {
      RoleArn: roleArn,
      RoleSessionName: sessionName,
      DurationSeconds: durationSeconds,
      ExternalId: externalId,
    } = parameters;
    const [, partition, , , accountId] = roleArn.split(':');
    const roleName = roleArn.slice(roleArn.lastIndexOf('/') + 1);
    const now = new Date();
    const accessKeyId = `ASIA${randomBytes(12)
      .toString('base64url')
      .toUpperCase()
      .replace(/[^A-Z0-9]/g, 'X')
      .slice(0, 16)}`;
    const call: AssumeRoleCall = { roleArn, sessionName, externalId, durationSeconds, accessKeyId, at: now };
    this.calls.push(call);
    if (this.calls.length > MAX_RECORDED_CALLS) this.calls.shift();
    const expiration = new Date(now.getTime() + durationSeconds * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z');
    const roleId = `AROA${randomBytes(8).toString('hex').toUpperCase()}`;
    return [
      `<AssumeRoleResponse xmlns="${STS_NAMESPACE}">`,
      '<AssumeRoleResult>',
      '<AssumedRoleUser>',
      `<AssumedRoleId>${roleId}:${escapeXml(sessionName)}</AssumedRoleId>`,
      `<Arn>arn:${partition}:sts::${accountId}:assumed-role/${escapeXml(roleName)}/${escapeXml(sessionName)}</Arn>`,
      '</AssumedRoleUser>',
      '<Credentials>',
      `<AccessKeyId>${accessKeyId}</AccessKeyId>`,
      `<SecretAccessKey>${randomBytes(30).toString('base64')}</SecretAccessKey>`,
      `<SessionToken>${randomBytes(96).toString('base64')}</SessionToken>`,
      `<Expiration>${expiration}</Expiration>`,
      '</Credentials>',
      '<PackedPolicySize>0</PackedPolicySize>',
      '</AssumeRoleResult>',
      `<ResponseMetadata><RequestId>${requestId}</RequestId></ResponseMetadata>`,
      '</AssumeRoleResponse>',
    ].join('');
  }
}

function escapeXml(text: string): string {
  return text.replace(/[<>&'"]/g, (char) => `&#${char.charCodeAt(0)};`);
}

/** STS errors as the Query protocol sends them; the SDK maps Code to the exception's name. */
function sendError(res: ServerResponse, status: number, code: string, message: string, requestId: string): void {
  sendXml(
    res,
    status,
    `<ErrorResponse xmlns="${STS_NAMESPACE}"><Error><Type>Sender</Type><Code>${code}</Code><Message>${escapeXml(message)}</Message></Error><RequestId>${requestId}</RequestId></ErrorResponse>`,
  );
}

function sendXml(res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, { 'Content-Type': 'text/xml', 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}
