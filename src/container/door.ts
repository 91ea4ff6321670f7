/** Starting the container-credentials door: its address on the node, its listener, its handler. */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { type ConnectionLimits, type ListeningServer, listen, splitHostPort } from '../http/listen.js';
import { type RunIp, bringUpLink, runIp } from '../node/dummy-link.js';
import { allowedHosts } from './wire.js';

export interface ContainerDoorOptions {
  /** host:port, BROKER_CONTAINER_LISTEN (not off). */
  readonly listen: string;
  /** BROKER_CONTAINER_LINK: a dummy link name, or off. */
  readonly link: string;
  /** The metadata door's per-caller and per-node connection limits, shared. */
  readonly limits: ConnectionLimits;
  readonly handler: (hosts: ReadonlySet<string>) => (req: IncomingMessage, res: ServerResponse) => void;
  readonly logger: Logger;
  readonly ip?: RunIp;
}

/** Undefined when the door could not open: logged, and the agent goes on with the metadata door alone. */
export async function startContainerDoor(options: ContainerDoorOptions): Promise<ListeningServer | undefined> {
  const { logger } = options;
  const { host, port } = splitHostPort(options.listen);
  if (options.link !== 'off') {
    try {
      const outcome = await bringUpLink(options.link, host, options.ip ?? runIp);
      if (outcome.kind === 'skipped') logger.info({ link: options.link }, outcome.reason);
    } catch (error) {
      logger.error(
        { link: options.link, host, err: String(error) },
        'could not bring up the container-credentials address on its link (needs NET_ADMIN and hostNetwork; BROKER_CONTAINER_LINK=off when it is managed elsewhere)',
      );
    }
  }
  try {
    const server = await listen(options.handler(allowedHosts(host, port)), options.listen, { limits: options.limits });
    logger.info({ containerListen: options.listen }, 'container-credentials door open');
    return server;
  } catch (error) {
    logger.error(
      { containerListen: options.listen, err: String(error) },
      'the container-credentials door cannot listen; serving the metadata door only',
    );
    return undefined;
  }
}
