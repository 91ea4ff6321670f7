#!/usr/bin/env node
/** The kube-iam-broker command: the agent by default, plus its companion subcommands. */
import { EventsCommandError, runEventsCommand } from './cli/events.js';
import { ConfigError, resolveConfig } from './config/load.js';
import { effectiveConfiguration } from './config/effective.js';
import { helpText } from './config/help.js';
import type { Config } from './config/schema.js';
import type { Logger } from 'pino';
import { type BoundedStdout, boundedStdout, createLogger } from './log.js';
import { cleanNode, nodeArtifacts } from './node/cleanup.js';
import { options } from './config/schema.js';
import { startAgent } from './main.js';
import { NodeToolError } from './node/exec.js';
import { VERSION as version } from './version.js';

/** Runs a long-lived command until SIGTERM/SIGINT, then stops it. Signals are handled from the start. */
async function runUntilSignal(
  logger: Logger,
  stdout: BoundedStdout,
  started: Promise<{ stop(): Promise<void> }>,
): Promise<void> {
  // The last lines (the shutdown itself) are still buffered: written out before the process ends.
  const exit = (code: number) => {
    stdout.flush();
    process.exit(code);
  };
  const shutdown = (signal: string) => {
    logger.info({ signal }, 'shutting down');
    started
      .then((running) => running.stop())
      .then(
        () => exit(0),
        (error: unknown) => {
          logger.error({ err: String(error) }, 'shutdown failed');
          exit(1);
        },
      );
  };
  process.once('SIGTERM', () => shutdown('SIGTERM'));
  process.once('SIGINT', () => shutdown('SIGINT'));
  await started;
}

/** The configuration, and a logger that has logged its warnings and the effective configuration. */
function configured(argv: string[]): { config: Config; logger: Logger; stdout: BoundedStdout } {
  const resolved = resolveConfig(argv, process.env);
  const { config } = resolved;
  const stdout = boundedStdout();
  const logger = createLogger(config.logLevel, stdout.stream);
  for (const warning of resolved.warnings) logger.warn(warning);
  logger.info({ config: effectiveConfiguration(resolved) }, 'effective configuration');
  return { config, logger, stdout };
}

async function runAgent(argv: string[]): Promise<void> {
  const { config, logger, stdout } = configured(argv);
  // A SIGTERM while the rules are being installed still ends the agent cleanly.
  await runUntilSignal(logger, stdout, startAgent(config, { logger, logLinesDropped: stdout.dropped }));
}

async function runWebhook(argv: string[]): Promise<void> {
  const { config, logger, stdout } = configured(argv);
  const { startWebhook } = await import('./webhook/main.js');
  await runUntilSignal(logger, stdout, startWebhook(config, { logger }));
}

/** Removes every rule, chain, guard and link the agent installed on this node; exits 1 when something stays. */
async function runNodeCleanup(argv: string[], env: NodeJS.ProcessEnv): Promise<void> {
  if (argv.length > 0)
    throw new ConfigError([
      `node-cleanup takes no arguments (got ${argv.join(' ')}); set BROKER_IPTABLES_BINARY to name a binary other than both backends`,
    ]);
  const binary = options.iptablesBinary.schema.safeParse(env.BROKER_IPTABLES_BINARY ?? options.iptablesBinary.default);
  if (!binary.success)
    throw new ConfigError([`BROKER_IPTABLES_BINARY: ${binary.error.issues.map((issue) => issue.message).join('; ')}`]);
  const link = options.containerLink.schema.safeParse(env.BROKER_CONTAINER_LINK ?? options.containerLink.default);
  if (!link.success)
    throw new ConfigError([`BROKER_CONTAINER_LINK: ${link.error.issues.map((issue) => issue.message).join('; ')}`]);
  const failed = await cleanNode(nodeArtifacts(binary.data, link.data), createLogger('info'));
  process.exitCode = failed === 0 ? 0 : 1;
}

async function main(argv: string[]): Promise<void> {
  if (argv[0] === 'events') return runEventsCommand(argv.slice(1), process.env);
  if (argv[0] === 'node-cleanup') return runNodeCleanup(argv.slice(1), process.env);
  if (argv[0] === 'webhook-certs')
    return (await import('./webhook/bootstrap.js')).runWebhookCertsCommand(argv.slice(1));
  if (argv.includes('--help') || argv.includes('-h')) return void console.log(helpText(version));
  if (argv.includes('--version')) return void console.log(version);
  if (argv[0] === 'demo') {
    // Loaded only when asked for: the agent itself never loads the embedded servers.
    const { runDemo } = await import('./sandbox/demo.js');
    process.exitCode = await runDemo(argv.slice(1));
    return;
  }
  if (argv[0] === 'webhook') return runWebhook(argv.slice(1));
  await runAgent(argv);
}

/** Errors the operator can act on: their message says what to do, so no stack trace. */
const isActionable = (error: unknown): error is Error =>
  error instanceof ConfigError || error instanceof EventsCommandError || error instanceof NodeToolError;

main(process.argv.slice(2)).catch((error: unknown) => {
  console.error(isActionable(error) ? `kube-iam-broker: ${error.message}` : error);
  process.exit(2);
});
