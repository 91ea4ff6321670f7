/** Starting and draining the agent's HTTP servers (metadata and admin) and the webhook's HTTPS server. */
import { type IncomingMessage, type Server, type ServerOptions, type ServerResponse, createServer } from 'node:http';
import { type ServerOptions as HttpsServerOptions, createServer as createHttpsServer } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';

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

/** The address a connection comes from; IPv4 peers of a dual-stack socket (::ffff:a.b.c.d) as the plain address. */
export const peerAddress = (socket: { readonly remoteAddress?: string | undefined }): string =>
  (socket.remoteAddress ?? '').replace(/^::ffff:/, '');

/** Caps on open connections: in all, and per caller (source address). */
export interface ConnectionLimits {
  readonly maxConnections: number;
  /** Counts a caller's new connection; false refuses it (answered 429 and closed). */
  readonly open: (ip: string) => boolean;
  readonly close: (ip: string) => void;
  readonly onRefused: (ip: string) => void;
}

export interface ListenOptions {
  /** Serves HTTPS with these (certificate, key, SNICallback...) instead of plain HTTP. */
  readonly tls?: HttpsServerOptions;
  readonly limits?: ConnectionLimits;
}

export function listen(
  handler: (req: IncomingMessage, res: ServerResponse) => void,
  hostPort: string,
  { tls, limits }: ListenOptions = {},
): Promise<ListeningServer> {
  const { host, port } = splitHostPort(hostPort);
  // SDKs send a whole request at once: a client still sending headers after a few seconds is a
  // slow-loris, and the server's sweep (every second) closes it.
  const timeouts: ServerOptions = {
    requestTimeout: 10_000,
    headersTimeout: 5_000,
    connectionsCheckingInterval: 1_000,
    maxHeaderSize: 16_384,
  };
  const server: Server = tls ? createHttpsServer({ ...timeouts, ...tls }, handler) : createServer(timeouts, handler);
  server.on('clientError', refuseMalformed);
  // CONNECT is never served; without this listener Node drops the socket without an answer.
  server.on('connect', (_req: IncomingMessage, socket: Duplex) =>
    answerAndClose(socket, 405, 'Method Not Allowed', 'method CONNECT not allowed'),
  );
  // Idle keep-alive sockets of SDK clients are closed quickly so they never pin a shutdown.
  server.keepAliveTimeout = 5_000;
  if (limits) limitConnections(server, limits);
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

function limitConnections(server: Server, limits: ConnectionLimits): void {
  // Beyond this Node closes new connections at once, before any byte is read.
  server.maxConnections = limits.maxConnections;
  server.on('connection', (socket: Socket) => {
    const ip = peerAddress(socket);
    if (!limits.open(ip)) {
      limits.onRefused(ip);
      return answerAndClose(socket, 429, 'Too Many Requests', 'too many open connections from this address');
    }
    socket.once('close', () => limits.close(ip));
  });
}

/** What Node's HTTP parser rejected, answered with a status and a reason instead of a bare close. */
function refuseMalformed(error: Error & { code?: string }, socket: Socket): void {
  if (error.code === 'ECONNRESET' || !socket.writable) return void socket.destroy();
  if (error.code === 'HPE_HEADER_OVERFLOW')
    return answerAndClose(socket, 431, 'Request Header Fields Too Large', 'request headers too large');
  if (error.code === 'ERR_HTTP_REQUEST_TIMEOUT')
    return answerAndClose(socket, 408, 'Request Timeout', 'request not received in time');
  answerAndClose(socket, 400, 'Bad Request', `malformed request (${error.code ?? 'parse error'})`);
}

function answerAndClose(socket: Duplex, status: number, statusText: string, reason: string): void {
  // Destroyed once the answer is flushed: a client that never closes its side cannot keep the socket.
  socket.end(
    `HTTP/1.1 ${status} ${statusText}\r\nContent-Type: text/plain\r\nContent-Length: ${Buffer.byteLength(reason)}\r\nConnection: close\r\n\r\n${reason}`,
    () => socket.destroy(),
  );
}
