/** The package version, read from package.json next to src/ and dist/ alike (the image ships it beside dist). */
import { readFileSync } from 'node:fs';
import { z } from 'zod';

export const VERSION: string = z
  .object({ version: z.string().min(1) })
  .parse(JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'))).version;
