#!/usr/bin/env node
/** The kube-iam-broker command: the agent by default, plus its companion subcommands. */
import { readFileSync } from 'node:fs';
import { ConfigError, loadConfig } from './config/load.js';
import { helpText } from './config/help.js';
import { createLogger } from './log.js';
import { startAgent } from './main.js';

const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };

async function runAgent(argv: string[]): Promise<void> {
  const config = loadConfig(argv, process.env);
  const logger = createLogger(config.logLevel);
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
  if (argv.includes('--help') || argv.includes('-h')) return void console.log(helpText(version));
  if (argv.includes('--version')) return void console.log(version);
  await runAgent(argv);
}

main(process.argv.slice(2)).catch((error: unknown) => {
  console.error(error instanceof ConfigError ? `kube-iam-broker: ${error.message}` : error);
  process.exit(2);
});
