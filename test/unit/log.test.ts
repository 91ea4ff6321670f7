import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { closeSync, constants, mkdtempSync, openSync, readSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { boundedStdout, createLogger } from '../../src/log.js';

describe('the log destination', () => {
  it('drops and counts lines beyond its buffer when stdout does not keep up, instead of queueing them', async () => {
    // A pipe nobody reads: what stdout is when the container runtime falls behind.
    const dir = mkdtempSync(join(tmpdir(), 'kib-log-'));
    const fifo = join(dir, 'stdout');
    execFileSync('mkfifo', [fifo]);
    const readFd = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
    const writeFd = openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK);
    const maxBytes = 64 * 1024;
    const out = boundedStdout(maxBytes, writeFd);
    const logger = createLogger('info', out.stream);
    const lines = 20_000;
    for (let i = 0; i < lines; i += 1)
      logger.warn(
        { event: 'credential.denied', podIp: '10.0.0.7', status: 404, reason: 'role "x" is not this pod\'s role' },
        'credential.denied',
      );
    const line = 200; // bytes, about
    assert.ok(out.dropped() > lines - (2 * maxBytes) / line - 1_000, `dropped ${out.dropped()} of ${lines}`);
    // What was kept is readable, whole lines first.
    const buffer = Buffer.alloc(4_096);
    await new Promise((resolve) => setTimeout(resolve, 50));
    const read = readSync(readFd, buffer);
    assert.match(
      buffer.subarray(0, read).toString().split('\n')[0] ?? '',
      /^\{"level":40,.*"event":"credential.denied"/,
    );
    // Read the rest so the destination can finish its write and close.
    const stream = out.stream as unknown as NodeJS.EventEmitter & { end(): void };
    const closed = new Promise((resolve) => stream.once('close', resolve));
    stream.end();
    const drain = setInterval(() => {
      try {
        while (readSync(readFd, buffer) > 0);
      } catch {
        // EAGAIN: nothing to read right now
      }
    }, 5);
    await closed;
    clearInterval(drain);
    closeSync(readFd);
    rmSync(dir, { recursive: true, force: true });
  });
});
