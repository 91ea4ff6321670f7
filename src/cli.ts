#!/usr/bin/env node
/** The kube-iam-broker command: the agent by default, plus its companion subcommands. */
import { EventsCommandError, runEventsCommand } from './cli/events.js';
import { ConfigError, resolveConfig } from './config/load.js';
import { effectiveConfiguration } from './config/effective.js';
import { helpText } from './config/help.js';
import { createLogger } from './log.js';
import { startAgent } from './main.js';
import { NodeToolError } from './node/exec.js';
import { VERSION as version } from './version.js';

async function runAgent(argv: string[]): Promise<void> {
  const resolved = resolveConfig(argv, process.env);
  const { config } = resolved;
  const logger = createLogger(config.logLevel);
  for (const warning of resolved.warnings) logger.warn(warning);
  logger.info({ config: effectiveConfiguration(resolved) }, 'effective configuration');
  // Signals are handled from the start: a SIGTERM while the DNAT rule is being installed still removes it.
  const agent = startAgent(config, { logger });
  const shutdown = (signal: string) => {
    logger.info({ signal }, 'shutting down');
    agent.then((running) => running.stop()).then(
      () => process.exit(0),
      (error: unknown) => {
        logger.error({ err: String(error) }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  process.once('SIGTERM', () => shutdown('SIGTERM'));
  process.once('SIGINT', () => shutdown('SIGINT'));
  await agent;
}

async function main(argv: string[]): Promise<void> {
  if (argv[0] === 'events') return runEventsCommand(argv.slice(1), process.env);
  if (argv.includes('--help') || argv.includes('-h')) return void console.log(helpText(version));
  if (argv.includes('--version')) return void console.log(version);
  if (argv[0] === 'demo') {
    // Loaded only when asked for: the agent itself never loads the embedded servers.
    const { runDemo } = await import('./demo/demo.js');
    process.exitCode = await runDemo(argv.slice(1));
    return;
  }
  await runAgent(argv);
}

/** Errors the operator can act on: their message says what to do, so no stack trace. */
const isActionable = (error: unknown): error is Error => error instanceof ConfigError || error instanceof EventsCommandError || error instanceof NodeToolError;

main(process.argv.slice(2)).catch((error: unknown) => {
  console.error(isActionable(error) ? `kube-iam-broker: ${error.message}` : error);
  process.exit(2);
});
