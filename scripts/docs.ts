/** `npm run docs`: rewrites the README's generated sections from src/config/schema.ts. */
import { readFileSync, writeFileSync } from 'node:fs';
import { withGeneratedSections } from '../src/config/docs.js';

const readmePath = new URL('../README.md', import.meta.url);
const current = readFileSync(readmePath, 'utf8');
const generated = withGeneratedSections(current);
if (generated !== current) writeFileSync(readmePath, generated);
console.log(
  generated === current
    ? 'README.md: generated sections already up to date'
    : 'README.md: generated sections rewritten',
);
