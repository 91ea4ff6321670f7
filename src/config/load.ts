import { supplyProblems } from '../credentials/lifetimes.js';
import { type Config, type OptionName, type OptionSpec, flagOf, optionEntries } from './schema.js';

export class ConfigError extends Error {
  constructor(readonly problems: readonly string[]) {
    super(`invalid configuration:\n  ${problems.join('\n  ')}`);
    this.name = 'ConfigError';
  }
}

interface FlagTarget {
  readonly name: OptionName;
  readonly spec: OptionSpec;
  readonly translate?: (value: string) => string;
}

function flagTargets(): Map<string, FlagTarget> {
  const targets = new Map<string, FlagTarget>();
  for (const [name, spec] of optionEntries()) {
    targets.set(flagOf(spec), { name, spec });
    for (const alias of spec.aliases ?? []) targets.set(alias.flag, { name, spec, translate: alias.translate });
  }
  return targets;
}

/** Raw option text from flags: `--flag=value`, `--flag value`, and a bare `--flag` for booleans. */
function readFlags(argv: readonly string[], problems: string[]): Map<OptionName, string> {
  const targets = flagTargets();
  const raw = new Map<OptionName, string>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    const [flag, inlineValue] = arg.includes('=') ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)] : [arg, undefined];
    const target = targets.get(flag);
    if (!target) {
      problems.push(`unknown argument "${arg}" (see --help)`);
      continue;
    }
    let value = inlineValue;
    if (value === undefined) {
      if (target.spec.kind === 'boolean') value = 'true';
      else if (i + 1 < argv.length) value = argv[++i];
      else {
        problems.push(`${flag} needs a value`);
        continue;
      }
    }
    raw.set(target.name, target.translate ? target.translate(value as string) : (value as string));
  }
  return raw;
}

/**
 * Builds the configuration from defaults, then the environment, then flags (flags win, as an
 * operator overriding a manifest's env expects). Every bad value is reported, not just the first.
 */
export function loadConfig(argv: readonly string[], env: NodeJS.ProcessEnv): Config {
  const problems: string[] = [];
  const fromFlags = readFlags(argv, problems);
  const values: Record<string, unknown> = {};
  for (const [name, spec] of optionEntries()) {
    const source = fromFlags.has(name) ? `${flagOf(spec)}` : env[spec.env] !== undefined && env[spec.env] !== '' ? spec.env : 'default';
    const text = fromFlags.get(name) ?? (env[spec.env] !== '' ? env[spec.env] : undefined) ?? spec.default;
    const parsed = spec.schema.safeParse(text);
    if (parsed.success) values[name] = parsed.data;
    else problems.push(`${spec.env} (${flagOf(spec)}) from ${source}: ${parsed.error.issues.map((issue) => issue.message).join('; ')}`);
  }
  if (problems.length === 0) problems.push(...supplyProblems(values as Config));
  if (problems.length > 0) throw new ConfigError(problems);
  return values as Config;
}

/** One warning per deprecated option that is set, to log at start. */
export const deprecationWarnings = (config: Config): string[] =>
  optionEntries().flatMap(([name, spec]) => (spec.deprecated !== undefined && config[name] !== undefined ? [spec.deprecated] : []));
