#!/usr/bin/env node
/** The kube-iam-broker command: the agent by default, plus its companion subcommands. */
import { EventsCommandError, runEventsCommand } from './cli/events.js';
import { ConfigError, loadConfig } from './config/load.js';
import { helpText } from './config/help.js';
import { createLogger } from './log.js';
import { cleanNode, nodeArtifacts } from './node/cleanup.js';
import { options } from './config/schema.js';
import { startAgent } from './main.js';
import { VERSION as version } from './version.js';

async function runAgent(argv: string[]): Promise<void> {
  const config = loadConfig(argv, process.env);
  const logger = createLogger(config.logLevel);
  // Signals are handled from the start: a SIGTERM while the rules are being installed still ends the agent cleanly.
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

/** Removes every rule, chain and guard the agent installed on this node; exits 1 when something stays. */
async function runNodeCleanup(argv: string[], env: NodeJS.ProcessEnv): Promise<void> {
  if (argv.length > 0) throw new ConfigError([`node-cleanup takes no arguments (got ${argv.join(' ')}); set BROKER_IPTABLES_BINARY to name a binary other than both backends`]);
  const binary = options.iptablesBinary.schema.safeParse(env.BROKER_IPTABLES_BINARY ?? options.iptablesBinary.default);
  if (!binary.success) throw new ConfigError([`BROKER_IPTABLES_BINARY: ${binary.error.issues.map((issue) => issue.message).join('; ')}`]);
  const failed = await cleanNode(nodeArtifacts(binary.data), createLogger('info'));
  process.exitCode = failed === 0 ? 0 : 1;
}

async function main(argv: string[]): Promise<void> {
  if (argv[0] === 'events') return runEventsCommand(argv.slice(1), process.env);
  if (argv[0] === 'node-cleanup') return runNodeCleanup(argv.slice(1), process.env);
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
