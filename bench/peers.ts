/**
 * The three servers the bench compares, each as its own process: kube-iam-broker (node dist/cli.js),
 * a bare node:http server answering the agent's exact bytes, and kube2iam 0.15 built from source
 * (../shared/peers/kube2iam; HOWTO.md there). Figures read from /proc, as an operator's tools would.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFile } from 'node:fs/promises';
import { type IncomingHttpHeaders, request } from 'node:http';

export interface Answer {
  status: number;
  body: string;
  headers: IncomingHttpHeaders;
}

export function get(url: string, localAddress: string, timeoutMs = 5_000): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(url, { localAddress, agent: false, timeout: timeoutMs }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

export async function until(what: string, check: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`timed out waiting until ${what}`);
}

export class Process {
  constructor(
    readonly name: string,
    private readonly child: ChildProcess,
    /** Where a pod's credential requests go, up to the role name. */
    readonly credentialsUrl: string,
  ) {}

  static spawn(
    name: string,
    command: string,
    args: readonly string[],
    env: NodeJS.ProcessEnv,
    credentialsUrl: string,
  ): Process {
    const child = spawn(command, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr?.on('data', (chunk: Buffer) => {
      if (stderr.length < 20_000) stderr += chunk.toString('utf8');
    });
    child.on('exit', (code, signal) => {
      if (code !== 0 && signal === null) console.error(`${name} exited with ${code}:\n${stderr.slice(-4000)}`);
    });
    return new Process(name, child, credentialsUrl);
  }

  private async status(): Promise<string> {
    return readFile(`/proc/${this.child.pid}/status`, 'utf8');
  }

  async rssMb(): Promise<number> {
    return Number(/VmRSS:\s+(\d+)/.exec(await this.status())?.[1]) / 1024;
  }

  /** User + system CPU time so far, in seconds (utime and stime of /proc/PID/stat, in clock ticks). */
  async cpuSeconds(): Promise<number> {
    const stat = await readFile(`/proc/${this.child.pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = once(this.child, 'exit');
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
}

/** A bare node:http server in its own process, answering every request with these bytes. */
export function startBare(port: number, answer: Answer): Process {
  const script = `
    const body = process.env.BARE_BODY, headers = JSON.parse(process.env.BARE_HEADERS);
    require('node:http').createServer((req, res) => { res.writeHead(200, headers); res.end(body); }).listen(Number(process.env.BARE_PORT), '127.0.0.1');
    process.on('SIGTERM', () => process.exit(0));`;
  const headers = {
    'Content-Type': 'text/plain',
    Server: 'EC2ws',
    'X-Request-Id': String(answer.headers['x-request-id']),
    'Content-Length': String(Buffer.byteLength(answer.body)),
  };
  return Process.spawn(
    'bare node:http',
    process.execPath,
    ['-e', script],
    { ...process.env, BARE_PORT: String(port), BARE_BODY: answer.body, BARE_HEADERS: JSON.stringify(headers) },
    `http://127.0.0.1:${port}/latest/meta-data/iam/security-credentials/`,
  );
}
