/**
 * A CA and a serving certificate for the webhook, made with node:crypto alone (no openssl binary,
 * no cert-manager): ECDSA P-256 keys, and X.509 v3 certificates written in DER by the small
 * encoder below. Only what a TLS server certificate and its CA need is encoded.
 */
import {
  X509Certificate,
  createHash,
  createPrivateKey,
  generateKeyPairSync,
  randomBytes,
  sign,
  type KeyObject,
} from 'node:crypto';

// --- DER, the subset X.509 uses ---
const der = (tag: number, content: Buffer): Buffer => {
  const length = content.length;
  if (length < 0x80) return Buffer.concat([Buffer.from([tag, length]), content]);
  const bytes: number[] = [];
  for (let rest = length; rest > 0; rest >>= 8) bytes.unshift(rest & 0xff);
  return Buffer.concat([Buffer.from([tag, 0x80 | bytes.length, ...bytes]), content]);
};
const sequence = (...items: Buffer[]) => der(0x30, Buffer.concat(items));
const set = (...items: Buffer[]) => der(0x31, Buffer.concat(items));
const explicit = (number: number, content: Buffer) => der(0xa0 | number, content);
const octetString = (content: Buffer) => der(0x04, content);
const bitString = (content: Buffer, unusedBits = 0) => der(0x03, Buffer.concat([Buffer.from([unusedBits]), content]));
const booleanTrue = der(0x01, Buffer.from([0xff]));
const utf8 = (text: string) => der(0x0c, Buffer.from(text, 'utf8'));
/** A non-negative INTEGER: a leading zero byte keeps the top bit from reading as a sign. */
const unsignedInteger = (bytes: Buffer) =>
  der(0x02, bytes[0]! & 0x80 ? Buffer.concat([Buffer.from([0]), bytes]) : bytes);
const oid = (dotted: string): Buffer => {
  const [first, second, ...rest] = dotted.split('.').map(Number) as [number, number, ...number[]];
  const bytes = [first * 40 + second];
  for (const arc of rest) {
    const groups = [arc & 0x7f];
    for (let value = arc >>> 7; value > 0; value >>>= 7) groups.unshift(0x80 | (value & 0x7f));
    bytes.push(...groups);
  }
  return der(0x06, Buffer.from(bytes));
};
/** UTCTime until 2049, GeneralizedTime after, as RFC 5280 requires. */
const time = (date: Date): Buffer => {
  const iso = date.toISOString().replace(/[-:T]/g, '').slice(0, 14);
  return date.getUTCFullYear() < 2050 ? der(0x17, Buffer.from(`${iso.slice(2)}Z`)) : der(0x18, Buffer.from(`${iso}Z`));
};

const ECDSA_WITH_SHA256 = sequence(oid('1.2.840.10045.4.3.2'));
const name = (commonName: string) => sequence(set(sequence(oid('2.5.4.3'), utf8(commonName))));
const extension = (id: string, critical: boolean, value: Buffer) =>
  sequence(oid(id), ...(critical ? [booleanTrue] : []), octetString(value));
/** RFC 5280's method 1: SHA-1 of the public key's bits. */
const keyIdentifier = (publicKey: KeyObject): Buffer => {
  const spki = publicKey.export({ type: 'spki', format: 'der' });
  return createHash('sha1')
    .update(spki.subarray(spki.length - 65))
    .digest();
};

interface Issued {
  readonly certificatePem: string;
  readonly privateKeyPem: string;
}

interface CertificateRequest {
  readonly commonName: string;
  readonly ca: boolean;
  readonly dnsNames: readonly string[];
  readonly validDays: number;
  readonly publicKey: KeyObject;
  /** The signer: itself for a CA (self-signed), the CA for a serving certificate. */
  readonly issuer: { readonly commonName: string; readonly privateKey: KeyObject; readonly publicKey: KeyObject };
  readonly now: Date;
}

function certificate(request: CertificateRequest): string {
  const notBefore = new Date(request.now.getTime() - 5 * 60_000); // clock skew between nodes
  const notAfter = new Date(request.now.getTime() + request.validDays * 86_400_000);
  const serial = randomBytes(16);
  serial[0]! &= 0x7f;
  const extensions = [
    extension('2.5.29.19', true, request.ca ? sequence(booleanTrue) : sequence()),
    // keyUsage: digitalSignature, plus keyCertSign and cRLSign for the CA (bits counted from the top).
    extension('2.5.29.15', true, request.ca ? bitString(Buffer.from([0x86]), 1) : bitString(Buffer.from([0x80]), 7)),
    extension('2.5.29.14', false, octetString(keyIdentifier(request.publicKey))),
    extension('2.5.29.35', false, sequence(der(0x80, keyIdentifier(request.issuer.publicKey)))),
    ...(request.ca
      ? []
      : [
          extension('2.5.29.37', false, sequence(oid('1.3.6.1.5.5.7.3.1'))),
          extension(
            '2.5.29.17',
            false,
            sequence(...request.dnsNames.map((dnsName) => der(0x82, Buffer.from(dnsName, 'ascii')))),
          ),
        ]),
  ];
  const tbs = sequence(
    explicit(0, der(0x02, Buffer.from([2]))),
    unsignedInteger(serial),
    ECDSA_WITH_SHA256,
    name(request.issuer.commonName),
    sequence(time(notBefore), time(notAfter)),
    name(request.commonName),
    request.publicKey.export({ type: 'spki', format: 'der' }),
    explicit(3, sequence(...extensions)),
  );
  const signature = sign('sha256', tbs, request.issuer.privateKey);
  const body = sequence(tbs, ECDSA_WITH_SHA256, bitString(signature)).toString('base64');
  return `-----BEGIN CERTIFICATE-----\n${body.match(/.{1,64}/g)!.join('\n')}\n-----END CERTIFICATE-----\n`;
}

const newKeyPair = () => generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
const pemOf = (privateKey: KeyObject) => privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;

export function makeCa(commonName: string, validDays: number, now = new Date()): Issued {
  const { privateKey, publicKey } = newKeyPair();
  const certificatePem = certificate({
    commonName,
    ca: true,
    dnsNames: [],
    validDays,
    publicKey,
    issuer: { commonName, privateKey, publicKey },
    now,
  });
  return { certificatePem, privateKeyPem: pemOf(privateKey) };
}

/** A serving certificate for dnsNames (the first is also its subject), signed by the CA. */
export function makeServingCertificate(
  ca: Issued,
  dnsNames: readonly string[],
  validDays: number,
  now = new Date(),
): Issued {
  const { privateKey, publicKey } = newKeyPair();
  const caCertificate = new X509Certificate(ca.certificatePem);
  const issuer = {
    commonName: caCommonName(caCertificate),
    privateKey: createPrivateKey(ca.privateKeyPem),
    publicKey: caCertificate.publicKey,
  };
  return {
    certificatePem: certificate({
      commonName: dnsNames[0] as string,
      ca: false,
      dnsNames,
      validDays,
      publicKey,
      issuer,
      now,
    }),
    privateKeyPem: pemOf(privateKey),
  };
}

const caCommonName = (ca: X509Certificate): string =>
  /(?:^|\n)CN=([^\n]+)/.exec(ca.subject)?.[1] ?? 'kube-iam-broker webhook CA';

/** Days left before the certificate expires (negative once it has). */
export const daysLeft = (certificatePem: string, now = new Date()): number =>
  (new Date(new X509Certificate(certificatePem).validTo).getTime() - now.getTime()) / 86_400_000;
