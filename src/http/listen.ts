/** Starting and draining the agent's HTTP servers (metadata and admin). */
import { type IncomingMessage, type Server, type ServerResponse, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ListeningServer {
  readonly server: Server;
  readonly address: AddressInfo;
  /** Stops accepting, lets in-flight requests finish within graceMs, then closes what is left. */
  close(graceMs: number): Promise<void>;
}

/** `10.0.0.1:8181` or `[::1]:8182` (as validated by the config schema) → host without brackets, and port. */
export function splitHostPort(hostPort: string): { host: string; port: number } {
  const separator = hostPort.lastIndexOf(':');
  return { host: hostPort.slice(0, separator).replace(/^\[|\]$/g, ''), port: Number(hostPort.slice(separator + 1)) };
}

export function listen(handler: (req: IncomingMessage, res: ServerResponse) => void, hostPort: string): Promise<ListeningServer> {
  const { host, port } = splitHostPort(hostPort);
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
