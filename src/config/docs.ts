/**
 * The README's sections that come from the option list, like --help: the configuration table and
 * the flags kube2iam and kiam users can keep. `npm run docs` writes them between their markers;
 * a test fails when the README and the schema drift apart.
 */
import { retiredFlags } from './retired-flags.js';
import { flagOf, optionEntries, usedByText } from './schema.js';

/** A table cell: a pipe would end the cell (also inside code spans), a newline the row. */
const cell = (text: string): string => text.replace(/\|/g, '\\|').replace(/\s*\n\s*/g, ' ');
const code = (text: string): string => `\`${cell(text)}\``;

export function configurationTable(): string {
  const rows = optionEntries().map(([, spec]) => {
    const aliases = (spec.aliases ?? []).map((alias) => `${code(alias.flag)} (${alias.from})`).join(', ');
    const defaultText = spec.default === undefined ? 'unset' : code(spec.default);
    return `| ${code(spec.env)} | ${code(flagOf(spec))} | ${spec.kind} | ${defaultText} | ${cell(spec.description)}${usedByText(spec)}${aliases ? ` Also accepted: ${aliases}.` : ''} |`;
  });
  return ['| Variable | Flag | Type | Default | Meaning |', '|---|---|---|---|---|', ...rows].join('\n');
}

/** Each kube2iam or kiam flag the agent accepts as is, with what it means here (values translated as the agent does). */
export function migrationFlagTable(): string {
  const rows = optionEntries().flatMap(([, spec]) =>
    (spec.aliases ?? []).map((alias) => {
      // A switch or bare boolean flag is shown alone; a duration with kube2iam's default, to show the translation; anything else with a placeholder.
      if (alias.switch)
        return `| ${code(alias.flag)} | ${alias.from} | ${code(`${spec.env}=${alias.switch.on}`)} (${code(flagOf(spec))}) |`;
      const [theirs, given] =
        spec.kind === 'boolean'
          ? [alias.flag, 'true']
          : spec.kind === 'duration'
            ? [`${alias.flag} 15m`, '15m']
            : [`${alias.flag} X`, 'X'];
      const value = alias.translate ? alias.translate(given) : given;
      return `| ${code(theirs)} | ${alias.from} | ${code(`${spec.env}=${value}`)} (${code(flagOf(spec))}) |`;
    }),
  );
  return ['| Their flag | From | Here |', '|---|---|---|', ...rows].join('\n');
}

/** Their flags with no counterpart: accepted with a warning, or refused, and why. */
export function retiredFlagTable(): string {
  const rows = retiredFlags.map(
    (flag) =>
      `| ${code(flag.flag)} | ${flag.from} | ${flag.refuse ? (flag.refuse('false') ? 'refused' : 'refused when on, else warned') : 'warned, no effect'} | ${cell(flag.why)} |`,
  );
  return ['| Their flag | From | Here | Why |', '|---|---|---|---|', ...rows].join('\n');
}

const SECTIONS: Record<string, () => string> = {
  configuration: configurationTable,
  'migration-flags': migrationFlagTable,
  'retired-flags': retiredFlagTable,
};

const begin = (name: string) => `<!-- BEGIN GENERATED ${name} (npm run docs; edit src/config/schema.ts instead) -->`;
const end = (name: string) => `<!-- END GENERATED ${name} -->`;

/** The README with every generated section rewritten from the schema; throws when a section's markers are missing. */
export function withGeneratedSections(readme: string): string {
  let text = readme;
  for (const [name, render] of Object.entries(SECTIONS)) {
    const start = text.indexOf(begin(name));
    const stop = text.indexOf(end(name));
    if (start < 0 || stop < start)
      throw new Error(`README.md has no generated section "${name}": add the lines\n${begin(name)}\n${end(name)}`);
    text = `${text.slice(0, start)}${begin(name)}\n${render()}\n${text.slice(stop)}`;
  }
  return text;
}
