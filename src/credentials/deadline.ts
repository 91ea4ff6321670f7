/** A client waits at most its request's deadline; what it waited for goes on below, for the next request. */
import type { CredentialSupply } from './supply.js';

/** Not an STS answer: STS was merely slower than the caller can wait. The door answers it with a retryable 503. */
export class DeadlineExceeded extends Error {
  constructor(readonly deadlineMs: number) {
    super(`no credentials from STS within ${deadlineMs} ms; still trying in the background`);
    this.name = 'DeadlineExceeded';
  }
}

export function withinDeadline(inner: CredentialSupply): CredentialSupply {
  return (identity, request) => {
    const answer = inner(identity, request);
    const { deadlineMs } = request;
    if (deadlineMs === undefined) return answer;
    // Settled by whichever comes first; no race of promises, as cached answers take this path too.
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new DeadlineExceeded(deadlineMs)), Math.max(0, deadlineMs));
      answer.then(
        (supplied) => {
          clearTimeout(timer);
          resolve(supplied);
        },
        (error: unknown) => {
          clearTimeout(timer);
          reject(error);
        },
      );
    });
  };
}
