/** Starting and draining the agent's HTTP servers (metadata and admin). */
import { type IncomingMessage, type Server, type ServerResponse, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ListeningServer {
  readonly server: Server;
  readonly address: AddressInfo;
  /** Stops accepting, lets in-flight requests finish within graceMs, then closes what is left. */
  close(graceMs: number): Promise<void>;
}

export function listen(handler: (req: IncomingMessage, res: ServerResponse) => void, hostPort: string): Promise<ListeningServer> {
  const separator = hostPort.lastIndexOf(':');
  const host = hostPort.slice(0, separator).replace(/^\[|\]$/g, '');
  const port = Number(hostPort.slice(separator + 1));
  const server = createServer({ requestTimeout: 30_000, headersTimeout: 10_000, maxHeaderSize: 16_384 }, handler);
  // Idle keep-alive sockets of SDK clients are closed quickly so they never pin a shutdown.
  server.keepAliveTimeout = 5_000;
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve({
        server,
        address: server.address() as AddressInfo,
        close: (graceMs) =>
          new Promise<void>((done) => {
            const force = setTimeout(() => server.closeAllConnections(), graceMs);
            server.close(() => {
              clearTimeout(force);
              done();
            });
            server.closeIdleConnections();
          }),
      });
    });
  });
}
