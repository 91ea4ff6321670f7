/**
 * Namespace restrictions as kube2iam and kiam have them: a Namespace annotation lists, as a JSON
 * array (kube2iam), or as one regular expression (kiam), the roles its pods may assume. Each
 * pattern is matched against the full role ARN, anchored; a pattern that is not an ARN is joined
 * to the base ARN, as a bare role name is. Pure.
 */
import { z } from 'zod';
import type { NamespaceRecord } from '../cluster/namespaces.js';

export interface NamespaceRestrictions {
  /** The Namespace annotation holding the JSON array of allowed-role patterns (kube2iam). */
  readonly annotation: string;
  /** The Namespace annotation holding one regular expression of permitted roles (kiam). */
  readonly permittedAnnotation: string;
  /** glob: `*` matches any run of characters (slashes too), everything else literally. regexp: a JavaScript regular expression. */
  readonly format: 'glob' | 'regexp';
}

export type RestrictionCheck = { readonly allowed: true } | { readonly allowed: false; readonly reason: string };

const PatternList = z.array(z.string(), { error: 'expected a JSON array of strings' });

const escapeRegExp = (text: string): string => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

export type CompiledPattern =
  | { readonly kind: 'pattern'; readonly regex: RegExp }
  /** A bare-name pattern while the base ARN is unknown: it matches nothing yet. */
  | { readonly kind: 'needs-base-arn' }
  | { readonly kind: 'invalid' };

/** One pattern as an anchored regular expression over the full ARN. */
export function compilePattern(
  pattern: string,
  format: NamespaceRestrictions['format'],
  baseRoleArn: string | undefined,
): CompiledPattern {
  const isArn = pattern.startsWith('arn:');
  if (!isArn && baseRoleArn === undefined) return { kind: 'needs-base-arn' };
  const prefix = isArn ? '' : escapeRegExp(baseRoleArn as string);
  const body = format === 'glob' ? pattern.split('*').map(escapeRegExp).join('.*') : pattern;
  try {
    return { kind: 'pattern', regex: new RegExp(`^${prefix}(?:${body})$`) };
  } catch {
    return { kind: 'invalid' };
  }
}

type AnnotationCheck =
  | { readonly kind: 'allows' }
  | { readonly kind: 'refuses'; readonly reason: string }
  | { readonly kind: 'broken'; readonly reason: string };

/** kube2iam's JSON array of patterns. */
function checkAllowedList(
  text: string,
  roleArn: string,
  where: string,
  format: NamespaceRestrictions['format'],
  baseRoleArn: string | undefined,
): AnnotationCheck {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return { kind: 'broken', reason: `${where} is not valid JSON` };
  }
  const patterns = PatternList.safeParse(json);
  if (!patterns.success) return { kind: 'broken', reason: `${where}: ${patterns.error.issues[0]?.message}` };
  const compiled = patterns.data.map((pattern) => ({
    pattern,
    compiled: compilePattern(pattern, format, baseRoleArn),
  }));
  const invalid = compiled.find((entry) => entry.compiled.kind === 'invalid');
  if (invalid) return { kind: 'broken', reason: `${where} has an invalid regular expression "${invalid.pattern}"` };
  if (compiled.some((entry) => entry.compiled.kind === 'pattern' && entry.compiled.regex.test(roleArn)))
    return { kind: 'allows' };
  return { kind: 'refuses', reason: `is not allowed by ${where} (${JSON.stringify(patterns.data)})` };
}

/**
 * kiam's one regular expression. kiam users often anchor it themselves; the agent anchors it
 * anyway, so their own ^ and $ are dropped rather than left to match nothing mid-pattern.
 */
function checkPermitted(
  text: string,
  roleArn: string,
  where: string,
  baseRoleArn: string | undefined,
): AnnotationCheck {
  const pattern = text
    .trim()
    .replace(/^\^/, '')
    .replace(/(?<!\\)\$$/, '');
  // As in kiam, an empty expression permits nothing.
  if (pattern === '')
    return { kind: 'refuses', reason: `is not allowed by ${where}, which is empty and so permits no role` };
  const compiled = compilePattern(pattern, 'regexp', baseRoleArn);
  if (compiled.kind === 'invalid')
    return { kind: 'broken', reason: `${where} is an invalid regular expression "${text}"` };
  if (compiled.kind === 'pattern' && compiled.regex.test(roleArn)) return { kind: 'allows' };
  return { kind: 'refuses', reason: `is not allowed by ${where} ("${text}")` };
}

/**
 * Whether the namespace allows roleArn, by kube2iam's list or kiam's expression, whichever it has
 * (either allowing is enough). A missing annotation allows nothing, and a broken one denies as a
 * whole, even if another pattern would match. The default role is never asked about here.
 */
export function namespaceAllows(
  namespace: NamespaceRecord,
  roleArn: string,
  restrictions: NamespaceRestrictions,
  baseRoleArn: string | undefined,
): RestrictionCheck {
  const whereList = `namespace ${namespace.name} annotation ${restrictions.annotation}`;
  const wherePermitted = `namespace ${namespace.name} annotation ${restrictions.permittedAnnotation}`;
  const listText = namespace.annotations[restrictions.annotation];
  const permittedText = namespace.annotations[restrictions.permittedAnnotation];
  if (listText === undefined && permittedText === undefined) {
    return {
      allowed: false,
      reason: `role ${roleArn} is not allowed: namespace ${namespace.name} sets neither ${restrictions.annotation} nor ${restrictions.permittedAnnotation}`,
    };
  }
  const checks = [
    ...(listText === undefined
      ? []
      : [checkAllowedList(listText, roleArn, whereList, restrictions.format, baseRoleArn)]),
    ...(permittedText === undefined ? [] : [checkPermitted(permittedText, roleArn, wherePermitted, baseRoleArn)]),
  ];
  const broken = checks.find((check) => check.kind === 'broken');
  if (broken) return { allowed: false, reason: `role ${roleArn} denied: ${broken.reason}` };
  if (checks.some((check) => check.kind === 'allows')) return { allowed: true };
  return {
    allowed: false,
    reason: `role ${roleArn} ${checks.map((check) => (check.kind === 'refuses' ? check.reason : '')).join(', nor ')}`,
  };
}
