const UNIT_SECONDS: Record<string, number> = { s: 1, m: 60, h: 3600 };

/** Seconds in a duration written as Go and kube2iam write them ("1h", "15m", "1h30m", "900s"), or a bare number of seconds. */
export function parseDuration(text: string): number | undefined {
  const trimmed = text.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed);
  if (!/^(\d+[hms])+$/.test(trimmed)) return undefined;
  let seconds = 0;
  for (const [, amount, unit] of trimmed.matchAll(/(\d+)([hms])/g)) {
    seconds += Number(amount) * (UNIT_SECONDS[unit as string] ?? 0);
  }
  return seconds;
}
