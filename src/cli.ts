#!/usr/bin/env node
/** The kube-iam-broker command: the agent by default, plus its companion subcommands. */
import { EventsCommandError, runEventsCommand } from './cli/events.js';
import { ConfigError, loadConfig } from './config/load.js';
import { helpText } from './config/help.js';
import { boundedStdout, createLogger } from './log.js';
import { startAgent } from './main.js';
import { VERSION as version } from './version.js';

async function runAgent(argv: string[]): Promise<void> {
  const config = loadConfig(argv, process.env);
  const stdout = boundedStdout();
  const logger = createLogger(config.logLevel, stdout.stream);
  // Signals are handled from the start: a SIGTERM while the DNAT rule is being installed still removes it.
  const agent = startAgent(config, { logger, logLinesDropped: stdout.dropped });
  // The last lines (the shutdown itself) are still buffered: written out before the process ends.
  const exit = (code: number) => {
    stdout.flush();
    process.exit(code);
  };
  const shutdown = (signal: string) => {
    logger.info({ signal }, 'shutting down');
    agent.then((running) => running.stop()).then(
      () => exit(0),
      (error: unknown) => {
        logger.error({ err: String(error) }, 'shutdown failed');
        exit(1);
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

main(process.argv.slice(2)).catch((error: unknown) => {
  console.error(error instanceof ConfigError || error instanceof EventsCommandError ? `kube-iam-broker: ${error.message}` : error);
  process.exit(2);
});
