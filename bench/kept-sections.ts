import { readFile, writeFile } from 'node:fs/promises';

/**
 * BENCHMARKS.md sections that come from their own, longer runs live between markers; bench/run.ts
 * keeps them when it rewrites the rest.
 */
export interface SectionMarkers {
  readonly begin: string;
  readonly end: string;
}

const markers = (name: string, command: string): SectionMarkers => ({
  begin: `<!-- BEGIN ${name} (${command}) -->`,
  end: `<!-- END ${name} -->`,
});

export const LATE_PODS = markers('late-pods', 'npm run bench:late-pods');
export const FIRST_REQUEST = markers('first-request', 'npm run bench:first-request');
export const KEPT_SECTIONS: readonly SectionMarkers[] = [LATE_PODS, FIRST_REQUEST];

/** The marked section of a BENCHMARKS.md text, markers included, or undefined. */
export function markedSection(text: string, { begin, end }: SectionMarkers): string | undefined {
  const from = text.indexOf(begin);
  const to = text.indexOf(end);
  return from >= 0 && to > from ? text.slice(from, to + end.length) : undefined;
}

/** The text with its marked section replaced by (or, when it has none, followed by) section. */
export function withMarkedSection(text: string, markers: SectionMarkers, section: string): string {
  const current = markedSection(text, markers);
  return current === undefined ? `${text.trimEnd()}\n\n${section}\n` : text.replace(current, () => section);
}

/** Prints section and writes it into BENCHMARKS.md, the rest of the file kept. */
export async function writeMarkedSection(markers: SectionMarkers, section: string): Promise<void> {
  console.log(section);
  const path = new URL('../BENCHMARKS.md', import.meta.url);
  await writeFile(
    path,
    withMarkedSection(await readFile(path, 'utf8').catch(() => '# Benchmarks\n'), markers, section),
  );
}
