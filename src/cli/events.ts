/**
 * `kube-iam-broker events`: tails a running agent's audit stream (GET /events as NDJSON). One line
 * per event for a person by default, the raw NDJSON with --json. It prints the agent's buffered
 * events; with --follow it then keeps printing, and resumes with Last-Event-ID when the agent restarts.
 */
import { request } from 'node:http';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import { z } from 'zod';
import { describeEvent } from '../audit/describe.js';
import { retryDelayMs } from '../backoff.js';
import { type StreamMessage, StreamMessageSchema } from '../audit/stream-message.js';
import { NDJSON } from '../audit/sse.js';
import { options } from '../config/schema.js';
import { splitHostPort } from '../http/listen.js';

const USAGE = `Usage: kube-iam-broker events [--follow] [--namespace N] [--pod P] [--type T[,T...]] [--json] [--admin HOST:PORT]

  --follow       print the buffered events, then keep printing new ones (resuming after an agent restart); without it, print the buffered events and exit
  --namespace    only events about pods in this namespace
  --pod          only events about this pod
  --type         event types, comma-separated; a trailing * matches a prefix (credential.*)
  --json         print the raw NDJSON, one event per line
  --admin        the agent's admin address (default: BROKER_ADMIN_LISTEN, else 127.0.0.1:8182)

The bearer token, when the agent requires one, is read from BROKER_ADMIN_TOKEN.`;

/** Consecutive failed connections before giving up; a connection that succeeds resets the count. */
const MAX_RECONNECTS = 10;
const RECONNECT_BACKOFF = { initialMs: 250, maxMs: 5_000 };

const Arguments = z.object({
  follow: z.boolean().default(false),
  json: z.boolean().default(false),
  namespace: z.string().min(1).optional(),
  pod: z.string().min(1).optional(),
  type: z.string().min(1).optional(),
  admin: options.adminListen.schema,
});
type EventsArguments = z.output<typeof Arguments>;

export class EventsCommandError extends Error {}

export async function runEventsCommand(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
  out: NodeJS.WritableStream = process.stdout,
): Promise<void> {
  const { values } = parseCommandLine(argv);
  if (values.help) return void out.write(`${USAGE}\n`);
  const parsed = Arguments.safeParse({
    ...values,
    admin: values.admin ?? (env.BROKER_ADMIN_LISTEN || '127.0.0.1:8182'),
  });
  if (!parsed.success)
    throw new EventsCommandError(
      `${parsed.error.issues.map((issue) => `--${issue.path.join('.')}: ${issue.message}`).join('; ')}\n${USAGE}`,
    );
  await tail(parsed.data, env.BROKER_ADMIN_TOKEN || undefined, out);
}

function parseCommandLine(argv: readonly string[]) {
  try {
    return parseArgs({
      args: [...argv],
      options: {
        follow: { type: 'boolean', short: 'f' },
        json: { type: 'boolean' },
        namespace: { type: 'string', short: 'n' },
        pod: { type: 'string' },
        type: { type: 'string', short: 't' },
        admin: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
    });
  } catch (error) {
    throw new EventsCommandError(`${(error as Error).message}\n${USAGE}`);
  }
}

async function tail(args: EventsArguments, token: string | undefined, out: NodeJS.WritableStream): Promise<void> {
  const print = (message: StreamMessage, raw: string) => out.write(`${args.json ? raw : humanLine(message)}\n`);
  let lastEventId: number | undefined;
  let failures = 0;
  for (;;) {
    const result = await readStream(args, token, lastEventId, (message, raw) => {
      if ('id' in message) lastEventId = message.id;
      print(message, raw);
    });
    if (result.kind === 'refused') throw new EventsCommandError(result.reason);
    if (!args.follow) {
      if (result.kind === 'failed')
        throw new EventsCommandError(`cannot read events from ${args.admin}: ${result.reason}`);
      return;
    }
    failures = result.kind === 'failed' ? failures + 1 : 0;
    if (failures > MAX_RECONNECTS)
      throw new EventsCommandError(
        `gave up after ${MAX_RECONNECTS} failed reconnects to ${args.admin}: ${result.kind === 'failed' ? result.reason : ''}`,
      );
    const delay = retryDelayMs(Math.max(0, failures - 1), RECONNECT_BACKOFF);
    // Said on stderr, so a person knows the command is waiting and a pipe of events stays clean.
    const why =
      result.kind === 'failed'
        ? `cannot reach the agent at ${args.admin} (${result.reason})`
        : `the agent at ${args.admin} ended the stream`;
    process.stderr.write(
      `kube-iam-broker events: ${why}; retrying in ${delay} ms${failures > 0 ? ` (attempt ${failures} of ${MAX_RECONNECTS})` : ''}\n`,
    );
    await new Promise((resolve) => setTimeout(resolve, delay));
  }
}

type ReadResult = { kind: 'ended' } | { kind: 'failed'; reason: string } | { kind: 'refused'; reason: string };

/** One connection: resolves when the agent ends the stream or the connection fails. */
function readStream(
  args: EventsArguments,
  token: string | undefined,
  lastEventId: number | undefined,
  onMessage: (message: StreamMessage, raw: string) => void,
): Promise<ReadResult> {
  const admin = splitHostPort(args.admin);
  // An agent listening on every address is reached on loopback.
  const host = admin.host.replace(/^0\.0\.0\.0$/, '127.0.0.1').replace(/^::$/, '::1');
  const query = new URLSearchParams({ follow: String(args.follow) });
  if (args.namespace) query.set('namespace', args.namespace);
  if (args.pod) query.set('pod', args.pod);
  if (args.type) query.set('type', args.type);
  const headers: Record<string, string> = { Accept: NDJSON };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (lastEventId !== undefined) headers['Last-Event-ID'] = String(lastEventId);
  // The first connection prints what the agent buffered; a reconnect resumes after the last event printed.
  else query.set('backlog', 'true');
  return new Promise((resolve) => {
    const req = request({ host, port: admin.port, path: `/events?${query.toString()}`, headers }, (res) => {
      if (res.statusCode !== 200) {
        let body = '';
        res.setEncoding('utf8').on('data', (chunk: string) => (body += chunk.slice(0, 1_000)));
        res.on('end', () => {
          const reason = `the agent answered ${res.statusCode}: ${body.trim()}`;
          // A refused token or filter will not get better by retrying; an agent still starting might.
          resolve(
            res.statusCode === 400 || res.statusCode === 401 ? { kind: 'refused', reason } : { kind: 'failed', reason },
          );
        });
        return;
      }
      const lines = createInterface({ input: res, crlfDelay: Infinity });
      lines.on('line', (line) => {
        if (line.trim() === '') return; // heartbeat
        const message = StreamMessageSchema.safeParse(parseJson(line));
        if (message.success) onMessage(message.data, line);
        else
          process.stderr.write(
            `kube-iam-broker events: skipped a line that does not match the schema: ${line.slice(0, 200)}\n`,
          );
      });
      lines.on('close', () => resolve({ kind: 'ended' }));
    });
    req.on('error', (error) => resolve({ kind: 'failed', reason: error.message }));
    req.end();
  });
}

const parseJson = (line: string): unknown => {
  try {
    return JSON.parse(line);
  } catch {
    return undefined;
  }
};

/** The event's time, then the same readable line the demo prints. */
export function humanLine(message: StreamMessage): string {
  if (message.type === 'stream.gap')
    return `${message.time} stream.gap        -- ${message.dropped} event(s) not received (${message.reason}) --`;
  return `${message.time} ${describeEvent(message)}`;
}
