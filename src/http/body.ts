/** Reading a request body with a size cap, for the embedded servers and the webhook. */
import type { IncomingMessage } from 'node:http';

/**
 * The body as text, or the tooLarge error once it passes maxBytes. Reading then stops without
 * destroying the request, so the caller can still answer (413) before the connection closes.
 */
export function readBody(req: IncomingMessage, maxBytes: number, tooLarge: () => Error): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size <= maxBytes) return void chunks.push(chunk);
      req.off('data', onData).off('end', onEnd).pause();
      chunks.length = 0;
      reject(tooLarge());
    };
    const onEnd = () => resolve(Buffer.concat(chunks).toString('utf8'));
    req.on('data', onData).on('end', onEnd).once('error', reject);
  });
}
