import { type SupplySettings, supplyProblems } from '../credentials/lifetimes.js';
import { retiredFlags } from './retired-flags.js';
import {
  type Alias,
  type Config,
  type OptionName,
  type OptionSpec,
  type Peer,
  flagOf,
  optionEntries,
  options,
} from './schema.js';

/** A configuration (or an environment it names) the agent cannot run with: exit 2 with these lines, no stack trace. */
export class ConfigError extends Error {
  constructor(readonly problems: readonly string[]) {
    super(
      problems.length === 1
        ? `invalid configuration: ${problems[0]}`
        : `invalid configuration:\n  ${problems.join('\n  ')}`,
    );
    this.name = 'ConfigError';
  }
}

/** Where an option's value came from, as the effective-configuration line and error messages show it. */
export type ValueSource =
  | { readonly kind: 'default'; readonly peer?: Peer }
  | { readonly kind: 'env'; readonly name: string }
  | { readonly kind: 'flag'; readonly flag: string; readonly text: string; readonly alias?: Alias };

export interface ResolvedConfig {
  readonly config: Config;
  readonly sources: Readonly<Record<OptionName, ValueSource>>;
  /** One line each: flags of kube2iam or kiam accepted but without effect here. */
  readonly warnings: readonly string[];
}

interface FlagTarget {
  readonly name: OptionName;
  readonly spec: OptionSpec;
  readonly alias?: Alias;
}

function flagTargets(): Map<string, FlagTarget> {
  const targets = new Map<string, FlagTarget>();
  for (const [name, spec] of optionEntries()) {
    targets.set(flagOf(spec), { name, spec });
    for (const alias of spec.aliases ?? []) targets.set(alias.flag, { name, spec, alias });
  }
  return targets;
}

interface FlagReading {
  readonly raw: Map<OptionName, { text: string; source: ValueSource }>;
  readonly warnings: string[];
  /** Peers whose own flags (not shared ones) appear on the command line. */
  readonly peers: Set<Peer>;
}

const takesNoValue = (target: FlagTarget): boolean =>
  target.alias?.switch !== undefined || (target.spec.kind === 'boolean' && target.alias?.translate === undefined);

/** Raw option text from flags: `--flag=value`, `--flag value`, and a bare `--flag` for switches. */
function readFlags(argv: readonly string[], problems: string[]): FlagReading {
  const targets = flagTargets();
  const retired = new Map(retiredFlags.map((flag) => [flag.flag, flag]));
  const reading: FlagReading = { raw: new Map(), warnings: [], peers: new Set() };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    const [flag, inlineValue] = arg.includes('=')
      ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)]
      : [arg, undefined];
    const target = targets.get(flag);
    const retiredFlag = retired.get(flag);
    if (!target && !retiredFlag) {
      problems.push(
        `unknown argument "${arg}"${didYouMean(flag, [...targets.keys(), ...retired.keys()])} (see --help)`,
      );
      continue;
    }
    const isSwitch = retiredFlag ? retiredFlag.isSwitch : takesNoValue(target as FlagTarget);
    const value = inlineValue ?? (isSwitch ? 'true' : argv[i + 1]);
    if (value === undefined) {
      problems.push(`${flag} needs a value`);
      continue;
    }
    if (inlineValue === undefined && !isSwitch) i++;
    const from = retiredFlag?.from ?? target?.alias?.from;
    if (from) reading.peers.add(from);
    if (retiredFlag) {
      const line = `${flag}${isSwitch && inlineValue === undefined ? '' : `=${value}`} (${retiredFlag.from}) ${retiredFlag.refuse?.(value) ? 'is not supported' : 'has no effect'}: ${retiredFlag.why}`;
      (retiredFlag.refuse?.(value) ? problems : reading.warnings).push(line);
      continue;
    }
    const { name, alias } = target as FlagTarget;
    const text = alias?.switch
      ? value === 'false' || value === '0'
        ? alias.switch.off
        : alias.switch.on
      : alias?.translate
        ? alias.translate(value)
        : value;
    if (text === undefined) continue;
    reading.raw.set(name, { text, source: { kind: 'flag', flag, text: value, alias } });
  }
  return reading;
}

/**
 * Builds the configuration from defaults, then the environment, then flags (flags win, as an
 * operator overriding a manifest's env expects). Every bad value is reported, not just the first;
 * an unknown BROKER_* variable is refused, since a misspelt one would silently leave its option off.
 */
export function resolveConfig(argv: readonly string[], env: NodeJS.ProcessEnv): ResolvedConfig {
  const problems: string[] = [];
  const flags = readFlags(argv, problems);
  problems.push(...unknownVariables(env));
  const values: Record<string, unknown> = {};
  const sources = {} as Record<OptionName, ValueSource>;
  for (const [name, spec] of optionEntries()) {
    const { text, source } = flags.raw.get(name) ?? fromEnvironment(spec, env) ?? defaultOf(spec, flags.peers);
    sources[name] = source;
    if (spec.secret && source.kind === 'flag') {
      flags.warnings.push(
        `${source.flag} on the command line shows in the process list (ps, /proc/PID/cmdline) to everyone on the node: pass ${spec.env} in the environment (from a Secret) instead`,
      );
    }
    const parsed = spec.schema.safeParse(text);
    if (parsed.success) values[name] = parsed.data;
    else
      problems.push(`${describeSource(spec, source)}: ${parsed.error.issues.map((issue) => issue.message).join('; ')}`);
  }
  if (problems.length === 0) sharedMetricsPort(values, sources, flags.warnings);
  if (problems.length === 0) {
    problems.push(
      ...supplyProblems(values as Config, (setting: keyof SupplySettings) => settingLabel(setting, sources)),
    );
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return { config: values as Config, sources, warnings: flags.warnings };
}

export function loadConfig(argv: readonly string[], env: NodeJS.ProcessEnv): Config {
  return resolveConfig(argv, env).config;
}

function fromEnvironment(spec: OptionSpec, env: NodeJS.ProcessEnv): { text: string; source: ValueSource } | undefined {
  for (const name of [spec.env, spec.compatEnv]) {
    const text = name === undefined ? undefined : env[name];
    if (name !== undefined && text !== undefined && text !== '') return { text, source: { kind: 'env', name } };
  }
  return undefined;
}

function defaultOf(spec: OptionSpec, peers: ReadonlySet<Peer>): { text: string | undefined; source: ValueSource } {
  const peer = [...peers].find((candidate) => spec.peerDefaults?.[candidate] !== undefined);
  return peer
    ? { text: spec.peerDefaults?.[peer], source: { kind: 'default', peer } }
    : { text: spec.default, source: { kind: 'default' } };
}

/**
 * kube2iam serves /metrics on its app port when --metrics-port names the same port (its chart
 * renders both as 8181). Here metrics keep their own listener, on the default address.
 */
function sharedMetricsPort(
  values: Record<string, unknown>,
  sources: Record<OptionName, ValueSource>,
  warnings: string[],
): void {
  const source = sources.metricsListen;
  const portOf = (hostPort: unknown) => String(hostPort).slice(String(hostPort).lastIndexOf(':') + 1);
  if (source.kind !== 'flag' || !source.alias || portOf(values.metricsListen) !== portOf(values.listen)) return;
  values.metricsListen = options.metricsListen.schema.parse(options.metricsListen.default);
  sources.metricsListen = { kind: 'default' };
  warnings.push(
    `${source.flag}=${source.text} (${source.alias.from}) is the metadata port, where ${source.alias.from} also served /metrics: here /metrics stays on its own listener, ${String(values.metricsListen)} (BROKER_METRICS_LISTEN)`,
  );
}

/** How a message names a value: by the flag or variable the user typed, and what it stands for here. */
function describeSource(spec: OptionSpec, source: ValueSource): string {
  switch (source.kind) {
    case 'flag':
      return source.alias
        ? `${source.flag}=${source.text} (${source.alias.from}'s flag for ${spec.env})`
        : `${source.flag}=${source.text} (${spec.env})`;
    case 'env':
      return source.name === spec.env ? `${spec.env} (${flagOf(spec)})` : `${source.name} (read as ${spec.env})`;
    case 'default':
      return `${spec.env} (${flagOf(spec)}) default${source.peer ? ` for ${source.peer} users` : ''}`;
  }
}

/** The option's variable name, or the flag typed when a peer's flag set it (its value is translated). */
function settingLabel(name: OptionName, sources: Readonly<Record<OptionName, ValueSource>>): string {
  const spec: OptionSpec = options[name];
  const source = sources[name];
  return source.kind === 'flag' && source.alias ? `${source.flag}=${source.text}, i.e. ${spec.env}` : spec.env;
}

/** How the effective-configuration line shows a source. */
export function sourceText(source: ValueSource): string {
  if (source.kind === 'flag') return source.flag;
  if (source.kind === 'env') return source.name;
  return source.peer ? `default (${source.peer})` : 'default';
}

function unknownVariables(env: NodeJS.ProcessEnv): string[] {
  const known = optionEntries().map(([, spec]) => spec.env);
  const knownSet = new Set(known);
  return Object.keys(env)
    .filter((name) => name.startsWith('BROKER_') && !knownSet.has(name))
    .sort()
    .map(
      (name) =>
        `unknown variable ${name}${didYouMean(name, known)}: every BROKER_* variable must be an option (see --help), so a misspelt one cannot silently leave its option unset`,
    );
}

/** The closest known name, when one is close enough to be a likely typo. */
function didYouMean(name: string, known: readonly string[]): string {
  let best: { candidate: string; distance: number } | undefined;
  for (const candidate of known) {
    const distance = editDistance(name, candidate);
    if (!best || distance < best.distance) best = { candidate, distance };
  }
  return best && best.distance <= Math.max(3, Math.floor(name.length / 3)) ? ` (did you mean ${best.candidate}?)` : '';
}

function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(
        (previous[j] as number) + 1,
        (current[j - 1] as number) + 1,
        (previous[j - 1] as number) + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    }
    previous = current;
  }
  return previous[b.length] as number;
}

/** One warning per deprecated option that is set, to log at start. */
export const deprecationWarnings = (config: Config): string[] =>
  optionEntries().flatMap(([name, spec]) =>
    spec.deprecated !== undefined && config[name] !== undefined ? [spec.deprecated] : [],
  );
