/** PATCH bodies in the three content types kubectl and client-node send. */
import { isDeepStrictEqual } from 'node:util';
import { isPlainObject, type StoredObject } from './objects.js';
import { ApiError } from './status.js';

export function applyPatch(target: StoredObject, contentType: string, patch: unknown): StoredObject {
  switch (contentType) {
    // Node taints carry no patch strategy, so a strategic merge patch replaces the list whole,
    // which makes it identical to a JSON merge patch for every field this fake stores.
    case 'application/merge-patch+json':
    case 'application/strategic-merge-patch+json':
      return mergePatch(target, patch) as StoredObject;
    case 'application/json-patch+json':
      return applyJsonPatch(target, patch) as StoredObject;
    default:
      throw new ApiError(415, `the body of the request was in an unknown format: ${contentType || '(none)'}`);
  }
}

/** RFC 7386: objects merge recursively, null deletes, anything else replaces. */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isPlainObject(patch)) return structuredClone(patch);
  const result: Record<string, unknown> = isPlainObject(target) ? { ...target } : {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete result[key];
    else result[key] = mergePatch(result[key], value);
  }
  return result;
}

interface JsonPatchOp {
  op: string;
  path: string;
  value?: unknown;
  from?: string;
}

/** RFC 6902 on a deep copy, so a failing operation leaves the stored object untouched. */
function applyJsonPatch(target: unknown, patch: unknown): unknown {
  if (!Array.isArray(patch)) throw new ApiError(400, 'a JSON patch must be an array of operations');
  let doc = structuredClone(target);
  for (const op of patch as JsonPatchOp[]) doc = applyJsonPatchOp(doc, op);
  return doc;
}

function applyJsonPatchOp(doc: unknown, op: JsonPatchOp): unknown {
  switch (op.op) {
    case 'add':
      return pointerAdd(doc, op.path, structuredClone(op.value));
    case 'remove':
      return pointerRemove(doc, op.path);
    case 'replace':
      return pointerAdd(pointerRemove(doc, op.path), op.path, structuredClone(op.value));
    case 'test':
      if (!isDeepStrictEqual(pointerGet(doc, op.path), op.value)) throw new ApiError(422, `test failed at ${op.path}`);
      return doc;
    case 'copy':
      return pointerAdd(doc, op.path, structuredClone(pointerGet(doc, requiredFrom(op))));
    case 'move': {
      const value = pointerGet(doc, requiredFrom(op));
      return pointerAdd(pointerRemove(doc, requiredFrom(op)), op.path, value);
    }
    default:
      throw new ApiError(422, `unsupported JSON patch operation: ${String(op.op)}`);
  }
}

function requiredFrom(op: JsonPatchOp): string {
  if (typeof op.from !== 'string') throw new ApiError(422, `"${op.op}" needs a "from" pointer`);
  return op.from;
}

function parsePointer(pointer: unknown): string[] {
  if (typeof pointer !== 'string' || (pointer !== '' && !pointer.startsWith('/'))) {
    throw new ApiError(422, `invalid JSON pointer: ${String(pointer)}`);
  }
  if (pointer === '') return [];
  return pointer
    .slice(1)
    .split('/')
    .map((token) => token.replace(/~1/g, '/').replace(/~0/g, '~'));
}

/** Resolves all but the last token; returns the container and the last token. */
function pointerParent(doc: unknown, pointer: string): { parent: unknown; token: string } {
  const tokens = parsePointer(pointer);
  const token = tokens.pop();
  if (token === undefined) throw new ApiError(422, 'operations on the document root are not supported');
  let parent = doc;
  for (const t of tokens) parent = childOf(parent, t, pointer);
  return { parent, token };
}

function childOf(container: unknown, token: string, pointer: string): unknown {
  let child: unknown;
  if (Array.isArray(container)) child = (container as unknown[])[arrayIndex(container, token, pointer, false)];
  else if (isPlainObject(container)) child = container[token];
  if (child === undefined) throw new ApiError(422, `path not found: ${pointer}`);
  return child;
}

function arrayIndex(array: unknown[], token: string, pointer: string, insert: boolean): number {
  if (insert && token === '-') return array.length;
  const limit = insert ? array.length : array.length - 1;
  if (!/^(0|[1-9]\d*)$/.test(token) || Number(token) > limit) {
    throw new ApiError(422, `invalid array index in ${pointer}`);
  }
  return Number(token);
}

function pointerGet(doc: unknown, pointer: string): unknown {
  const { parent, token } = pointerParent(doc, pointer);
  return childOf(parent, token, pointer);
}

function pointerAdd(doc: unknown, pointer: string, value: unknown): unknown {
  const { parent, token } = pointerParent(doc, pointer);
  if (Array.isArray(parent)) parent.splice(arrayIndex(parent, token, pointer, true), 0, value);
  else if (isPlainObject(parent)) parent[token] = value;
  else throw new ApiError(422, `path not found: ${pointer}`);
  return doc;
}

function pointerRemove(doc: unknown, pointer: string): unknown {
  const { parent, token } = pointerParent(doc, pointer);
  childOf(parent, token, pointer); // a missing target fails the patch, as RFC 6902 requires
  if (Array.isArray(parent)) parent.splice(arrayIndex(parent, token, pointer, false), 1);
  else delete (parent as Record<string, unknown>)[token];
  return doc;
}
