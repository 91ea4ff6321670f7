import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { KNOWN_CLIENTS, clientHold } from '../../src/imds/client-holds.js';

const UNSET = { graceWindowMs: undefined, credentialDeadlineMs: undefined };

// The User-Agents as the real clients send them on metadata requests (../shared/reference/imds-protocol.md).
const HOLDS: ReadonlyArray<[string, string | undefined, string, number, number]> = [
  [
    'boto3',
    'Boto3/1.43.11 md/Botocore#1.43.11 ua/2.1 os/linux#6.1.0 md/arch#x86_64 lang/python#3.11.7 md/pyimpl#CPython cfg/retry-mode#legacy Botocore/1.43.11',
    'botocore',
    750,
    900,
  ],
  [
    'awscli',
    'aws-cli/2.15.0 md/awscrt#0.19.19 ua/2.0 os/linux#6.1.0 md/arch#x86_64 lang/python#3.11.6 md/pyimpl#CPython cfg/retry-mode#standard md/installer#exe md/distrib#debian.12 md/prompt#off md/command#sts.get-caller-identity botocore/1.43.11',
    'botocore',
    750,
    900,
  ],
  [
    'Go SDK v2',
    'aws-sdk-go-v2/1.17.1 os/linux lang/go/1.19.8 md/GOOS/linux md/GOARCH/amd64 ft/ec2-imds',
    'go-sdk-v2',
    300,
    450,
  ],
  ['Go SDK v1', 'aws-sdk-go/1.44.133 (go1.19.8; linux; amd64)', 'go-sdk-v1', 750, 900],
  ['JS SDK v3 (no User-Agent)', undefined, 'js-sdk-v3', 750, 900],
  ['an empty User-Agent', '  ', 'js-sdk-v3', 750, 900],
  ['Ruby SDK v3', 'aws-sdk-ruby3/3.168.1', 'ruby-sdk-v3', 750, 900],
  ['curl', 'curl/7.88.1', 'unrecognised', 300, 450],
  ['a Go client that only looks like the SDK', 'my-aws-sdk-go/1.0', 'unrecognised', 300, 450],
];

describe('hold per User-Agent', () => {
  for (const [who, userAgent, client, holdMs, deadlineMs] of HOLDS) {
    it(`${who}: ${client}, waits ${holdMs} ms, held ${deadlineMs} ms in all`, () => {
      assert.deepEqual(clientHold(userAgent, UNSET), { client, holdMs, deadlineMs });
    });
  }

  it('holds every known client inside its own per-attempt timeout, with room for STS after a full hold', () => {
    for (const row of KNOWN_CLIENTS) {
      assert.ok(row.holdMs + 150 <= row.deadlineMs, `${row.client}: an STS call's share after the hold`);
      assert.ok(
        row.deadlineMs <= row.attemptTimeoutMs - 50,
        `${row.client}: answered at least 50 ms before the client gives up`,
      );
      assert.match(row.source, /\d+ (ms|s)/, `${row.client}: the timeout's source is given`);
    }
  });

  it('BROKER_GRACE_WINDOW_MS is the hold of unrecognised clients and, set lower, bounds every hold', () => {
    assert.deepEqual(clientHold('curl/7.88.1', { graceWindowMs: 2_000, credentialDeadlineMs: undefined }), {
      client: 'unrecognised',
      holdMs: 2_000,
      deadlineMs: 2_150,
    });
    assert.equal(
      clientHold('aws-cli/2 botocore/1', { graceWindowMs: 2_000, credentialDeadlineMs: undefined }).holdMs,
      750,
      'a higher value never stretches a known SDK past its timeout',
    );
    assert.equal(
      clientHold('aws-cli/2 botocore/1', { graceWindowMs: 200, credentialDeadlineMs: undefined }).holdMs,
      200,
    );
    assert.equal(clientHold(undefined, { graceWindowMs: 0, credentialDeadlineMs: undefined }).holdMs, 0);
  });

  it('BROKER_CREDENTIAL_DEADLINE_MS, when set, bounds every request and its hold', () => {
    assert.deepEqual(clientHold('aws-sdk-go/1.44.133', { graceWindowMs: undefined, credentialDeadlineMs: 600 }), {
      client: 'go-sdk-v1',
      holdMs: 600,
      deadlineMs: 600,
    });
    assert.deepEqual(clientHold('curl/7.88.1', { graceWindowMs: undefined, credentialDeadlineMs: 5_000 }), {
      client: 'unrecognised',
      holdMs: 300,
      deadlineMs: 5_000,
    });
  });
});
