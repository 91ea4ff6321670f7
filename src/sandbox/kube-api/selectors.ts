/** Field and label selectors, and the namespace of a namespaced list, as one predicate on objects. */
import { isPlainObject, type StoredObject } from './objects.js';
import { ApiError } from './status.js';

export type Predicate = (object: StoredObject) => boolean;

type SelectorTerm = ((value: string | undefined) => boolean) & { key: string };

export function objectPredicate(query: URLSearchParams, namespace: string | undefined): Predicate {
  const fields = parseSelector(query.get('fieldSelector'), 'field');
  const labels = parseSelector(query.get('labelSelector'), 'label');
  return (object) =>
    (namespace === undefined || object.metadata.namespace === namespace) &&
    fields.every((term) => term(fieldValue(object, term.key))) &&
    labels.every((term) => term(object.metadata.labels?.[term.key]));
}

/**
 * Parses the equality-based selector grammar shared by field and label
 * selectors (`k=v`, `k==v`, `k!=v`, comma-joined); label selectors also allow
 * existence terms (`k`, `!k`). Set-based syntax is rejected rather than
 * silently mis-matched.
 */
function parseSelector(selector: string | null, kind: 'field' | 'label'): SelectorTerm[] {
  if (!selector) return [];
  return selector.split(',').map((raw) => {
    const text = raw.trim();
    const equality = /^([\w./-]+)\s*(==|=|!=)\s*([\w./:-]*)$/.exec(text);
    if (equality) {
      const [, key, op, expected] = equality as unknown as [string, string, string, string];
      return term(key, (value) => (op === '!=') !== ((value ?? '') === expected));
    }
    const existence = kind === 'label' ? /^(!?)([\w./-]+)$/.exec(text) : null;
    if (existence) {
      const [, negated, key] = existence as unknown as [string, string, string];
      return term(key, (value) => (value !== undefined) !== (negated === '!'));
    }
    throw new ApiError(400, `unable to parse ${kind} selector requirement: "${text}"`);
  });
}

function term(key: string, test: (value: string | undefined) => boolean): SelectorTerm {
  return Object.assign(test, { key });
}

/** Field selectors compare the string form of a dotted path; a missing field reads as "". */
function fieldValue(object: StoredObject, path: string): string {
  let value: unknown = object;
  for (const segment of path.split('.')) value = isPlainObject(value) ? value[segment] : undefined;
  if (typeof value === 'string' || typeof value === 'number' || typeof value === 'boolean') return String(value);
  // Selectable fields are scalars; an object or list never equals a selector's value.
  return value === undefined || value === null ? '' : JSON.stringify(value);
}
