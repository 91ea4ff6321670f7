/**
 * How long handed-out credentials must live, and when to refresh them ahead: pure arithmetic on
 * the session duration, shared by the cache and the configuration check.
 */

/**
 * botocore treats credentials within 15 minutes (plus jitter) of expiry as expiring and can use
 * them past their real end, so hand out nothing with less than 30 minutes left, or half the
 * session when sessions are shorter than an hour.
 */
export const minimumRemainingMs = (sessionDurationSeconds: number): number =>
  Math.min(30 * 60_000, (sessionDurationSeconds * 1000) / 2);

/** The least life every SDK's refresh logic copes with (botocore: 15 min advisory + jitter; see imds-protocol.md). */
export const SDK_MINIMUM_LIFE_MS = 25 * 60_000;

/**
 * When to refresh ahead: before the credentials fall below the minimum remaining life, by a lead
 * of a quarter of the usable life (at most 5 min) plus up to as much again of jitter, so that the
 * refreshes of pods started together spread out.
 */
export function refreshDelayMs(
  expirationMs: number,
  nowMs: number,
  sessionDurationSeconds: number,
  random: () => number,
): number {
  const minimumRemaining = minimumRemainingMs(sessionDurationSeconds);
  const lead = Math.min(5 * 60_000, (sessionDurationSeconds * 1000 - minimumRemaining) / 4);
  return Math.max(0, expirationMs - minimumRemaining - lead - random() * lead - nowMs);
}

export interface SupplySettings {
  readonly sessionDurationSeconds: number;
  readonly graceWindowMs: number | undefined;
  readonly credentialDeadlineMs: number | undefined;
}

const variableOf: Record<keyof SupplySettings, string> = {
  sessionDurationSeconds: 'BROKER_SESSION_DURATION',
  graceWindowMs: 'BROKER_GRACE_WINDOW_MS',
  credentialDeadlineMs: 'BROKER_CREDENTIAL_DEADLINE_MS',
};

/**
 * Option combinations that cannot work, each as a sentence naming the options involved (by their
 * variables, or as `name` says: the flag the user typed).
 */
export function supplyProblems(
  settings: SupplySettings,
  name: (setting: keyof SupplySettings) => string = (setting) => variableOf[setting],
): string[] {
  const problems: string[] = [];
  const handedOutMinutes = minimumRemainingMs(settings.sessionDurationSeconds) / 60_000;
  if (handedOutMinutes * 60_000 < SDK_MINIMUM_LIFE_MS) {
    problems.push(
      `${name('sessionDurationSeconds')}=${settings.sessionDurationSeconds}s hands out credentials with as little as ${handedOutMinutes} min left; ` +
        `SDKs (botocore) refresh from 15 min before expiry and need more than ${SDK_MINIMUM_LIFE_MS / 60_000} min, so use at least ${(2 * SDK_MINIMUM_LIFE_MS) / 60_000}m`,
    );
  }
  if (
    settings.credentialDeadlineMs !== undefined &&
    settings.graceWindowMs !== undefined &&
    settings.credentialDeadlineMs <= settings.graceWindowMs
  ) {
    problems.push(
      `${name('credentialDeadlineMs')}=${settings.credentialDeadlineMs} must exceed ${name('graceWindowMs')}=${settings.graceWindowMs}: the deadline covers the wait for the pod and the STS call after it`,
    );
  }
  return problems;
}
