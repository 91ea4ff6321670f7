/**
 * The serving certificate and key, re-read when their files change. A mounted Secret rotates by
 * the kubelet swapping a symlink, so the files are judged by what stat sees through the links
 * (inode, size, mtime): checked at most once a second as TLS handshakes arrive (SNICallback, which
 * the API server always triggers: it calls the Service by name), and every few seconds besides.
 * A half-rotated pair (new certificate, old key) fails to load and the previous pair keeps serving.
 */
import { X509Certificate } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { type SecureContext, createSecureContext } from 'node:tls';

export interface ServingCertificateFiles {
  readonly certFile: string;
  readonly keyFile: string;
}

export type ReloadOutcome = 'loaded' | 'failed';

export interface LoadedCertificate {
  readonly context: SecureContext;
  readonly notAfter: Date;
  readonly pem: { readonly cert: string; readonly key: string };
}

const CHECK_INTERVAL_MS = 1_000;
const POLL_INTERVAL_MS = 5_000;

function load(files: ServingCertificateFiles): LoadedCertificate {
  const cert = readFileSync(files.certFile, 'utf8');
  const key = readFileSync(files.keyFile, 'utf8');
  // createSecureContext refuses a key that does not match the certificate.
  const context = createSecureContext({ cert, key });
  return { context, notAfter: new Date(new X509Certificate(cert).validTo), pem: { cert, key } };
}

const signatureOf = (stats: Array<{ ino: number; size: number; mtimeMs: number }>) =>
  stats.map((s) => `${s.ino}:${s.size}:${s.mtimeMs}`).join('|');

export class ServingCertificate {
  private loaded: LoadedCertificate;
  private signature: string;
  private lastCheck = 0;
  private checking: Promise<void> | undefined;
  private readonly poll: NodeJS.Timeout;

  /** Loads the pair now (throws when it cannot: the webhook must not start without one). */
  constructor(
    private readonly files: ServingCertificateFiles,
    private readonly onReload: (outcome: ReloadOutcome, detail: { notAfter?: Date; error?: string }) => void,
  ) {
    this.signature = signatureOf([statSync(files.certFile), statSync(files.keyFile)]);
    this.loaded = load(files);
    this.poll = setInterval(() => void this.check(), POLL_INTERVAL_MS).unref();
  }

  get current(): LoadedCertificate {
    return this.loaded;
  }

  /** For tls.Server's SNICallback: the current context, after a re-check when the last is over a second old. */
  readonly sniCallback = (
    _servername: string,
    callback: (error: Error | null, context?: SecureContext) => void,
  ): void => {
    const fresh = Date.now() - this.lastCheck < CHECK_INTERVAL_MS;
    void (fresh ? Promise.resolve() : this.check()).then(() => callback(null, this.loaded.context));
  };

  /** Re-stats the files and reloads them when they changed; concurrent callers share one check. */
  check(): Promise<void> {
    this.checking ??= this.reloadIfChanged().finally(() => {
      this.lastCheck = Date.now();
      this.checking = undefined;
    });
    return this.checking;
  }

  stop(): void {
    clearInterval(this.poll);
  }

  private async reloadIfChanged(): Promise<void> {
    let signature: string;
    try {
      signature = signatureOf(await Promise.all([stat(this.files.certFile), stat(this.files.keyFile)]));
    } catch (error) {
      return this.onReload('failed', { error: String(error) });
    }
    if (signature === this.signature) return;
    try {
      this.loaded = load(this.files);
      this.signature = signature;
      this.onReload('loaded', { notAfter: this.loaded.notAfter });
    } catch (error) {
      // Left unrecorded, so the next check tries again once the other half of the pair has landed.
      this.onReload('failed', { error: String(error) });
    }
  }
}
