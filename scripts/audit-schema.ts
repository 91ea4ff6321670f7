/** Writes docs/audit-events.schema.json from the zod schema; test/unit/audit-schema.test.ts fails when the committed file drifts. */
import { writeFileSync } from 'node:fs';
import { renderAuditJsonSchema } from '../src/audit/stream-message.js';

writeFileSync(new URL('../docs/audit-events.schema.json', import.meta.url), renderAuditJsonSchema());
