/** The certificate set webhook-certs keeps, and the address the webhook writes into pods, from the configuration. */
import assert from 'node:assert/strict';
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { describe, it } from 'node:test';
import { ConfigError, loadConfig } from '../../src/config/load.js';
import { renewCertificates, serviceDnsNames } from '../../src/webhook/bootstrap.js';
import { wiringSettings } from '../../src/webhook/main.js';

const NAMES = serviceDnsNames('kube-iam-broker-webhook', 'kube-iam-broker');
const DAY = 86_400_000;
const bundle = (pem: string) =>
  pem.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g)!.map((block) => new X509Certificate(block));

describe('renewCertificates', () => {
  const now = new Date('2026-12-01T00:00:00Z');
  const first = renewCertificates(undefined, NAMES, 365, now);

  it('makes a CA and a serving certificate for every name the API server may use, issued by that CA', () => {
    assert.deepEqual(first.renewed, ['ca', 'serving']);
    const serving = new X509Certificate(first.serving.certificatePem);
    const [ca] = bundle(first.caBundle);
    assert.ok(ca?.ca && !serving.ca);
    assert.ok(serving.checkIssued(ca) && serving.verify(ca.publicKey));
    assert.equal(serving.subjectAltName, NAMES.map((name) => `DNS:${name}`).join(', '));
    assert.ok(serving.checkPrivateKey(createPrivateKey(first.serving.privateKeyPem)));
  });

  it('keeps both while they are good, and renews the serving certificate alone in its last third', () => {
    assert.deepEqual(renewCertificates(first, NAMES, 365, new Date(now.getTime() + 200 * DAY)).renewed, []);
    const later = renewCertificates(first, NAMES, 365, new Date(now.getTime() + 250 * DAY));
    assert.deepEqual(later.renewed, ['serving']);
    assert.equal(later.ca, first.ca);
    assert.equal(later.caBundle, first.caBundle);
  });

  it('renews the serving certificate when the Service names change', () => {
    assert.deepEqual(renewCertificates(first, serviceDnsNames('other', 'kube-iam-broker'), 365, now).renewed, [
      'serving',
    ]);
  });

  it('renews the CA in its last year and keeps the old one in the bundle until it expires', () => {
    const late = new Date(now.getTime() + 3300 * DAY);
    const renewed = renewCertificates(first, NAMES, 365, late);
    assert.deepEqual(renewed.renewed, ['ca', 'serving']);
    assert.deepEqual(
      bundle(renewed.caBundle).map((ca) => ca.fingerprint256),
      [
        new X509Certificate(renewed.ca.certificatePem).fingerprint256,
        new X509Certificate(first.ca.certificatePem).fingerprint256,
      ],
    );
    const serving = new X509Certificate(renewed.serving.certificatePem);
    assert.ok(serving.checkIssued(new X509Certificate(renewed.ca.certificatePem)));
  });
});

describe('wiringSettings (the webhook from BROKER_CONTAINER_LISTEN and BROKER_TOKEN_AUDIENCE)', () => {
  const settings = (env: Record<string, string>) => wiringSettings(loadConfig([], env));

  it('writes the address the agent listens on, without the port when it is 80', () => {
    assert.deepEqual(settings({}), {
      credentialsUri: 'http://169.254.170.23/v1/credentials',
      credentialsHost: '169.254.170.23',
      audience: 'kube-iam-broker',
      expirationSeconds: 3600,
    });
    assert.equal(
      settings({ BROKER_CONTAINER_LISTEN: '169.254.170.2:8080' }).credentialsUri,
      'http://169.254.170.2:8080/v1/credentials',
    );
    assert.deepEqual(settings({ BROKER_CONTAINER_LISTEN: '[fd00:ec2::23]:80', BROKER_TOKEN_AUDIENCE: 'sts.example' }), {
      credentialsUri: 'http://[fd00:ec2::23]/v1/credentials',
      credentialsHost: 'fd00:ec2::23',
      audience: 'sts.example',
      expirationSeconds: 3600,
    });
  });

  it('refuses an address the SDKs would not call over plain http, and a disabled door', () => {
    assert.throws(
      () => settings({ BROKER_CONTAINER_LISTEN: '10.0.0.5:80' }),
      (error: unknown) =>
        error instanceof ConfigError &&
        /SDKs refuse plain-http container credentials from 10\.0\.0\.5/.test(error.message),
    );
    assert.throws(() => settings({ BROKER_CONTAINER_LISTEN: 'off' }), /no container-credentials endpoint/);
    assert.throws(() => loadConfig([], { BROKER_WEBHOOK_TOKEN_EXPIRATION: '5m' }), /BROKER_WEBHOOK_TOKEN_EXPIRATION/);
  });
});
