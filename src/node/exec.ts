/** Running the node's network tools (iptables, conntrack): no shell, a bounded time, errors that say what to fix. */
import { execFile } from 'node:child_process';

export interface ToolResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** iptables and conntrack answer in milliseconds; this only stops a hung lock or netlink socket. */
export const TOOL_TIMEOUT_MS = 10_000;

export class NodeToolError extends Error {
  constructor(
    message: string,
    readonly result?: ToolResult,
  ) {
    super(message);
    this.name = 'NodeToolError';
  }
}

/**
 * Runs a tool and resolves with its exit code and output whatever the code (the callers know
 * which codes mean "no such rule" or "nothing to delete"). Rejects only when it cannot run at all:
 * missing binary, timeout, or a refusal that means the agent lacks NET_ADMIN.
 */
export function runTool(binary: string, args: readonly string[], timeoutMs = TOOL_TIMEOUT_MS): Promise<ToolResult> {
  return new Promise((resolve, reject) => {
    execFile(binary, args, { timeout: timeoutMs, killSignal: 'SIGKILL', encoding: 'utf8' }, (error, stdout, stderr) => {
      const command = [binary, ...args].join(' ');
      if (!error) return resolve({ code: 0, stdout, stderr });
      const failure = error as NodeJS.ErrnoException & { code?: number | string; killed?: boolean };
      if (failure.code === 'ENOENT')
        return reject(
          new NodeToolError(
            `${binary} not found: install it in the image (apt-get install iptables conntrack) or set its path`,
          ),
        );
      if (failure.killed) return reject(new NodeToolError(`${command} did not finish within ${timeoutMs} ms`));
      const result = { code: typeof failure.code === 'number' ? failure.code : 1, stdout, stderr };
      if (/Permission denied|Operation not permitted|you must be root/i.test(stderr)) {
        return reject(
          new NodeToolError(
            `${command} was refused (${stderr.trim()}): the agent needs the NET_ADMIN capability and hostNetwork`,
            result,
          ),
        );
      }
      resolve(result);
    });
  });
}

/** A failure the caller did not expect, with the tool's own words. */
export function unexpected(binary: string, args: readonly string[], result: ToolResult): NodeToolError {
  return new NodeToolError(
    `${[binary, ...args].join(' ')} exited with ${result.code}: ${(result.stderr || result.stdout).trim()}`,
    result,
  );
}
