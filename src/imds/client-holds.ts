/**
 * How long a credential request from an unknown caller is held, chosen from the SDK that sends it.
 *
 * Each SDK gives up on a metadata request after its own per-attempt timeout; a hold past it turns
 * a clear, retryable 503 into a client-side timeout. So each recognised client is held for its
 * timeout minus a margin for the answer that follows (an STS call when the held request is the
 * credentials one, and a loaded node). The User-Agent only chooses how long the agent waits for
 * the caller's pod, never what it answers: a caller that lies about it only changes its own wait.
 *
 * Every timeout below is the SDK's default, from ../shared/reference/imds-protocol.md ("How long a
 * client waits", gathered from the SDKs' source; the User-Agents from its capture of the real clients).
 */

import type { HoldClient } from '../audit/events.js';

export interface ClientHold {
  /** The table row that applied, for the lookup.waited event. */
  readonly client: HoldClient;
  /** How long the request waits for the caller's pod. */
  readonly holdMs: number;
  /** The longest the request is held in all (the wait plus the STS call after it). */
  readonly deadlineMs: number;
}

interface KnownClient {
  readonly client: Exclude<HoldClient, 'unrecognised'>;
  /** Matches the User-Agent header; undefined matches a request without one. */
  readonly userAgent: RegExp | undefined;
  /** The SDK's default per-attempt timeout, and where it comes from. */
  readonly attemptTimeoutMs: number;
  readonly source: string;
  /** Inside the timeout by the deadline's margin and an STS call's share (150 ms, as BROKER_CREDENTIAL_DEADLINE_MS's default). */
  readonly holdMs: number;
  /** Inside the timeout by 50 ms for Go v2 (as the 450 ms default deadline always was), 100 ms for the 1 s clients. */
  readonly deadlineMs: number;
}

export const KNOWN_CLIENTS: readonly KnownClient[] = [
  // Go v2 first: its User-Agent also starts with aws-sdk-go.
  {
    client: 'go-sdk-v2',
    userAgent: /^aws-sdk-go-v2\//,
    attemptTimeoutMs: 500,
    source: 'Go v2 feature/ec2/imds: response headers 500 ms (dial 250 ms), 3 attempts',
    holdMs: 300,
    deadlineMs: 450,
  },
  {
    client: 'go-sdk-v1',
    userAgent: /^aws-sdk-go\//,
    attemptTimeoutMs: 1_000,
    source: 'Go v1 ec2metadata: 1 s total per request, 3 attempts',
    holdMs: 750,
    deadlineMs: 900,
  },
  // boto3 sends "Boto3/… Botocore/…", awscli "aws-cli/… botocore/…".
  {
    client: 'botocore',
    userAgent: /\bbotocore\//i,
    attemptTimeoutMs: 1_000,
    source: 'botocore (boto3, awscli): 1 s connect and read, 1 attempt',
    holdMs: 750,
    deadlineMs: 900,
  },
  {
    client: 'ruby-sdk-v3',
    userAgent: /^aws-sdk-ruby3\//,
    attemptTimeoutMs: 1_000,
    source: 'Ruby v3 aws-sdk-core: 1 s open and read, 1 retry',
    holdMs: 750,
    deadlineMs: 900,
  },
  // The JS SDK v3 (@smithy/credential-provider-imds) is the one SDK that sends no User-Agent.
  {
    client: 'js-sdk-v3',
    userAgent: undefined,
    attemptTimeoutMs: 1_000,
    source: 'JS v3 @smithy/credential-provider-imds: 1 s socket idle, 1 attempt (maxRetries 0)',
    holdMs: 750,
    deadlineMs: 900,
  },
];

export interface HoldSettings {
  /** BROKER_GRACE_WINDOW_MS: the hold for unrecognised clients and, when set, the longest any client waits. */
  readonly graceWindowMs: number | undefined;
  /** BROKER_CREDENTIAL_DEADLINE_MS: when set, the longest any request is held in all. */
  readonly credentialDeadlineMs: number | undefined;
}

/** An unrecognised client's hold while BROKER_GRACE_WINDOW_MS is unset: Go v2's, the shortest timeout of any SDK. */
export const UNRECOGNISED_HOLD_MS = 300;
/** Kept for the STS call and the answer after a full hold, when no deadline is configured. */
const STS_SHARE_MS = 150;
const LEAST_DEADLINE_MS = 450;

export function clientHold(userAgent: string | undefined, settings: HoldSettings): ClientHold {
  const { graceWindowMs, credentialDeadlineMs } = settings;
  const ua = userAgent?.trim() || undefined;
  const known = KNOWN_CLIENTS.find((row) =>
    row.userAgent === undefined ? ua === undefined : ua !== undefined && row.userAgent.test(ua),
  );
  const atMost = (ms: number | undefined, bound: number | undefined) =>
    Math.min(ms ?? Number.POSITIVE_INFINITY, bound ?? Number.POSITIVE_INFINITY);
  if (known) {
    return {
      client: known.client,
      holdMs: atMost(atMost(known.holdMs, graceWindowMs), credentialDeadlineMs),
      deadlineMs: atMost(known.deadlineMs, credentialDeadlineMs),
    };
  }
  const holdMs = atMost(graceWindowMs ?? UNRECOGNISED_HOLD_MS, credentialDeadlineMs);
  return {
    client: 'unrecognised',
    holdMs,
    deadlineMs: credentialDeadlineMs ?? Math.max(LEAST_DEADLINE_MS, holdMs + STS_SHARE_MS),
  };
}
