/** The configuration in effect, as the agent logs it once at start: each value with its source, secrets redacted. */
import { type ResolvedConfig, sourceText } from './load.js';
import { optionEntries } from './schema.js';

export function effectiveConfiguration({
  config,
  sources,
}: ResolvedConfig): Record<string, { value: unknown; source: string }> {
  return Object.fromEntries(
    optionEntries().map(([name, spec]) => {
      const value = config[name];
      return [
        spec.env,
        {
          value: spec.secret && value !== undefined ? '(redacted)' : (value ?? null),
          source: sourceText(sources[name]),
        },
      ];
    }),
  );
}
