/**
 * Namespace restrictions as kube2iam has them: a Namespace annotation lists, as a JSON array, the
 * roles its pods may assume. Each pattern is matched against the full role ARN, anchored; a
 * pattern that is not an ARN is joined to the base ARN, as a bare role name is. Pure.
 */
import { z } from 'zod';
import type { NamespaceRecord } from '../cluster/namespaces.js';

export interface NamespaceRestrictions {
  /** The Namespace annotation holding the JSON array of allowed-role patterns. */
  readonly annotation: string;
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
export function compilePattern(pattern: string, format: NamespaceRestrictions['format'], baseRoleArn: string | undefined): CompiledPattern {
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

/** Whether the namespace allows roleArn. A missing annotation allows nothing (but the default role, which the caller never asks about). */
export function namespaceAllows(
  namespace: NamespaceRecord,
  roleArn: string,
  restrictions: NamespaceRestrictions,
  baseRoleArn: string | undefined,
): RestrictionCheck {
  const where = `namespace ${namespace.name} annotation ${restrictions.annotation}`;
  const text = namespace.annotations[restrictions.annotation];
  if (text === undefined) return { allowed: false, reason: `role ${roleArn} is not allowed: ${where} is not set` };
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return { allowed: false, reason: `role ${roleArn} denied: ${where} is not valid JSON` };
  }
  const patterns = PatternList.safeParse(json);
  if (!patterns.success) return { allowed: false, reason: `role ${roleArn} denied: ${where}: ${patterns.error.issues[0]?.message}` };
  // A broken annotation denies as a whole, even if another of its patterns would match.
  const compiled = patterns.data.map((pattern) => ({ pattern, compiled: compilePattern(pattern, restrictions.format, baseRoleArn) }));
  const invalid = compiled.find((entry) => entry.compiled.kind === 'invalid');
  if (invalid) return { allowed: false, reason: `role ${roleArn} denied: ${where} has an invalid regular expression "${invalid.pattern}"` };
  if (compiled.some((entry) => entry.compiled.kind === 'pattern' && entry.compiled.regex.test(roleArn))) return { allowed: true };
  return { allowed: false, reason: `role ${roleArn} is not allowed by ${where} (${JSON.stringify(patterns.data)})` };
}
