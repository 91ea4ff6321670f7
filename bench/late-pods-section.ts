/** BENCHMARKS.md's late-pods section (bench/late-pods.ts) lives between these markers; bench/run.ts keeps it when it rewrites the rest. */
export const LATE_PODS_BEGIN = '<!-- BEGIN late-pods (npm run bench:late-pods) -->';
export const LATE_PODS_END = '<!-- END late-pods -->';

/** The late-pods section of a BENCHMARKS.md text, markers included, or undefined. */
export function latePodsSection(text: string): string | undefined {
  const begin = text.indexOf(LATE_PODS_BEGIN);
  const end = text.indexOf(LATE_PODS_END);
  return begin >= 0 && end > begin ? text.slice(begin, end + LATE_PODS_END.length) : undefined;
}

/** The text with its late-pods section replaced by (or, when it has none, followed by) section. */
export function withLatePodsSection(text: string, section: string): string {
  const current = latePodsSection(text);
  return current === undefined ? `${text.trimEnd()}\n\n${section}\n` : text.replace(current, () => section);
}
