/**
 * Model-based test of "never a wrong role": random interleavings of pod churn, IP reuse, phase
 * changes, hostNetwork pods, watch outages with relists, namespace changes and lookups (also while
 * they wait, also cancelled) drive the real LivePodIndex + lookup + grantFor on virtual time. Every
 * answer is compared, at the moment it is given, with a small reference model written here
 * independently of src/.
 *
 * Reproduce a failure with MODEL_SEED=<seed printed below> (fast-check also prints the seed, the
 * path and the shrunk operation list).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { type Subscription, VirtualTimeScheduler, map } from 'rxjs';
import { type LookupOutcome, lookup } from '../../src/broker/lookup.js';
import { type IndexEvent, LivePodIndex } from '../../src/broker/pod-index.js';
import { type Grant, type RolePolicy, grantFor } from '../../src/broker/policy.js';
import type { NamespaceRecord } from '../../src/cluster/namespaces.js';
import type { PodRecord } from '../../src/cluster/pods.js';
import { podRecord } from '../support/pods.js';

const BASE = 'arn:aws:iam::123456789012:role/';
const ROLE_KEY = 'iam.amazonaws.com/role';
const ALLOWED_KEY = 'iam.amazonaws.com/allowed-roles';
const PERMITTED_KEY = 'iam.amazonaws.com/permitted';
const NODE = 'node-a';
const NAMES = ['a', 'b', 'c', 'd', 'e'] as const;
const NAMESPACES = ['ns1', 'ns2'] as const;
const namespaceOfName = (name: string) => (name < 'c' ? 'ns1' : 'ns2');
const IPS = ['10.0.0.1', '10.0.0.2', '10.0.0.3'] as const;
/** 'fallback' is also the default role when one is set: a pod may name it, and namespaces always allow it. */
const ROLES = [undefined, 'alpha', 'beta', 'fallback', 'arn:aws:iam::999999999999:role/gamma', 'not a role!'] as const;
/** Each request's hold (chosen from its client's User-Agent by the server): lookups of one scenario wait for different lengths. */
const HOLDS = [0, 1, 100, 300, 750] as const;
const PHASES = ['Pending', 'Running', 'Succeeded', 'Failed'] as const;
/** Namespace annotations: allowed lists (glob, bare names joined to BASE), an empty list, garbage, or none. */
const ALLOWED = [
  undefined,
  '["alpha"]',
  '["*"]',
  '["beta","arn:aws:iam::999999999999:role/gamma"]',
  '[]',
  'alpha',
] as const;
/** kiam's annotation: one regular expression over the whole ARN, bare ones joined to BASE; what each permits, or 'broken'. */
const PERMITTED: Record<string, (roleArn: string) => boolean | 'broken'> = {
  alpha: (roleArn) => roleArn === `${BASE}alpha`,
  '^(alpha|beta)$': (roleArn) => roleArn === `${BASE}alpha` || roleArn === `${BASE}beta`,
  '': () => false,
  '.*': (roleArn) => roleArn.startsWith(BASE),
  'arn:aws:iam::999999999999:role/gamma': (roleArn) => roleArn === 'arn:aws:iam::999999999999:role/gamma',
  '(': () => 'broken',
};

// ---- operations ---------------------------------------------------------------------------------

type Op =
  | {
      kind: 'create';
      name: string;
      ip: string | null;
      phase: string;
      hostNetwork: boolean;
      role: string | undefined;
      onNode: boolean;
      createdSecond: number;
    }
  | {
      kind: 'update';
      name: string;
      ip?: string | null;
      phase?: string;
      role?: string | undefined;
      hostNetwork?: boolean;
    }
  | { kind: 'delete'; name: string }
  | { kind: 'watchDown' }
  | { kind: 'relist' }
  | { kind: 'namespace'; name: string; allowed: string | undefined; permitted: string | undefined; present: boolean }
  | { kind: 'lookup'; ip: string; holdMs: number }
  | { kind: 'cancel'; which: number }
  | { kind: 'advance'; ms: number };

/** true about once in n draws */
const oneIn = (n: number) => fc.integer({ min: 1, max: n }).map((draw) => draw === 1);
const name = fc.constantFrom(...NAMES);
const ip = fc.constantFrom<string | null>(...IPS, null);
const phase = fc.constantFrom(...PHASES);
const role = fc.constantFrom(...ROLES);
const opArbitrary: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant('create' as const),
      name,
      ip,
      phase,
      hostNetwork: oneIn(6),
      role,
      onNode: oneIn(5).map((off) => !off),
      createdSecond: fc.integer({ min: 0, max: 5 }),
    }),
  },
  {
    weight: 4,
    arbitrary: fc.oneof(
      fc.record({ kind: fc.constant('update' as const), name, ip }),
      fc.record({ kind: fc.constant('update' as const), name, phase }),
      fc.record({ kind: fc.constant('update' as const), name, role }),
      fc.record({ kind: fc.constant('update' as const), name, hostNetwork: fc.boolean() }),
    ),
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('delete' as const), name }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'watchDown' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'relist' as const }) },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant('namespace' as const),
      name: fc.constantFrom(...NAMESPACES),
      allowed: fc.constantFrom(...ALLOWED),
      permitted: fc.constantFrom(undefined, undefined, ...Object.keys(PERMITTED)),
      present: oneIn(5).map((absent) => !absent),
    }),
  },
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('lookup' as const),
      ip: fc.constantFrom(...IPS),
      holdMs: fc.constantFrom(...HOLDS),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('cancel' as const), which: fc.nat(20) }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('advance' as const), ms: fc.integer({ min: 0, max: 400 }) }) },
);

interface Settings {
  readonly restrictions: boolean;
  readonly defaultRole: string | undefined;
}
const settingsArbitrary: fc.Arbitrary<Settings> = fc.record({
  restrictions: fc.boolean(),
  defaultRole: fc.constantFrom(undefined, 'fallback'),
});

// ---- the reference model: what the agent should know and answer, written from the spec -----------

const TERMINAL = ['Succeeded', 'Failed'];

class ReferenceModel {
  private readonly pods: PodRecord[] = [];
  /** `${uid} ${ip}` → the order in which that claim began (ties between equal creation times). */
  private readonly claimOrder = new Map<string, number>();
  private claimCounter = 0;
  private readonly namespaces = new Map<string, NamespaceRecord>();

  constructor(private readonly settings: Settings) {}

  apply(event: IndexEvent): void {
    if (event.event.type !== 'upsert' && event.event.type !== 'delete') return;
    if (event.resource === 'namespaces') {
      const ns = event.event.object;
      if (event.event.type === 'delete') this.namespaces.delete(ns.name);
      else this.namespaces.set(ns.name, ns);
      return;
    }
    if (event.resource !== 'pods') return;
    const pod = event.event.object;
    const previous = this.pods.filter(
      (p) =>
        p.uid === pod.uid || (event.event.type === 'upsert' && p.namespace === pod.namespace && p.name === pod.name),
    );
    for (const gone of previous) this.pods.splice(this.pods.indexOf(gone), 1);
    if (event.event.type === 'upsert') this.pods.push(pod);
    // Claims that ended are forgotten; claims that began get the next number; claims that go on keep theirs.
    const claimed = new Set(
      this.pods.flatMap((p) => (this.claims(p) ? p.ips.map((address) => `${p.uid} ${address}`) : [])),
    );
    for (const key of [...this.claimOrder.keys()]) if (!claimed.has(key)) this.claimOrder.delete(key);
    for (const key of claimed) if (!this.claimOrder.has(key)) this.claimOrder.set(key, ++this.claimCounter);
  }

  private claims(pod: PodRecord): boolean {
    return !pod.hostNetwork && !TERMINAL.includes(pod.phase);
  }

  owner(address: string): PodRecord | undefined {
    const rank = (pod: PodRecord) => [pod.createdAtMs, this.claimOrder.get(`${pod.uid} ${address}`) as number] as const;
    const claimants = this.pods.filter((pod) => this.claims(pod) && pod.ips.includes(address));
    return claimants.sort((x, y) => rank(y)[0] - rank(x)[0] || rank(y)[1] - rank(x)[1])[0];
  }

  /** The pod a lookup for this IP settles on now, or undefined if it must keep waiting. */
  known(address: string): PodRecord | undefined {
    const pod = this.owner(address);
    if (pod && this.settings.restrictions && !this.namespaces.has(pod.namespace)) return undefined;
    return pod;
  }

  /** What the answer must be now: the grant for the known pod, else the outcome after the hold. */
  expected(address: string): Expected {
    const { defaultRole, restrictions } = this.settings;
    const pod = this.known(address);
    if (!pod) {
      const waitingForNamespace = this.owner(address);
      if (waitingForNamespace) return { kind: 'denied', uid: waitingForNamespace.uid };
      // The default role is for known pods only: a caller no live pod owns is never given it.
      return { kind: 'retry' };
    }
    const annotated = pod.annotations[ROLE_KEY];
    if (annotated === undefined)
      return defaultRole === undefined
        ? { kind: 'no-role', uid: pod.uid }
        : { kind: 'role', uid: pod.uid, roleArn: BASE + defaultRole, source: 'default' };
    if (annotated.includes(' ')) return { kind: 'denied', uid: pod.uid };
    const roleArn = annotated.startsWith('arn:') ? annotated : BASE + annotated;
    const isDefaultRole = defaultRole !== undefined && roleArn === BASE + defaultRole;
    if (restrictions && !isDefaultRole && !this.namespaceAllows(pod.namespace, roleArn))
      return { kind: 'denied', uid: pod.uid, roleArn };
    return { kind: 'role', uid: pod.uid, roleArn, source: 'annotation' };
  }

  /** Either annotation allowing is enough; a broken one (not a JSON array, a bad expression) denies whatever the other says. */
  private namespaceAllows(namespace: string, roleArn: string): boolean {
    const annotations = this.namespaces.get(namespace)?.annotations ?? {};
    const list = annotations[ALLOWED_KEY];
    const permitted =
      annotations[PERMITTED_KEY] === undefined
        ? undefined
        : (PERMITTED[annotations[PERMITTED_KEY]] as (arn: string) => boolean | 'broken')(roleArn);
    if ((list !== undefined && !list.startsWith('[')) || permitted === 'broken') return false;
    const listed =
      list !== undefined &&
      (JSON.parse(list) as string[]).some((pattern) =>
        pattern === '*'
          ? roleArn.startsWith(BASE)
          : pattern.startsWith('arn:')
            ? pattern === roleArn
            : BASE + pattern === roleArn,
      );
    return listed || permitted === true;
  }
}

type Expected = { kind: Grant['kind']; uid?: string; roleArn?: string; source?: 'annotation' | 'default' };

function actualOf(grant: Grant): Expected {
  const actual: Expected = { kind: grant.kind };
  if (grant.pod) actual.uid = grant.pod.uid;
  if (grant.kind === 'role') Object.assign(actual, { roleArn: grant.identity.roleArn, source: grant.source });
  if (grant.kind === 'denied' && grant.roleArn !== undefined) actual.roleArn = grant.roleArn;
  return actual;
}

// ---- the cluster as the agent's informers present it --------------------------------------------

interface PendingLookup {
  readonly id: number;
  readonly ip: string;
  readonly holdMs: number;
  readonly startedAt: number;
  subscription?: Subscription;
  answer?: { outcome: LookupOutcome; grant: Grant };
  cancelled: boolean;
}

function runScenario(settings: Settings, ops: readonly Op[]): void {
  const scheduler = new VirtualTimeScheduler();
  const index = new LivePodIndex(NODE);
  // The model has no ServiceAccounts: the informer has listed them, and none names a role.
  index.apply({ resource: 'serviceaccounts', event: { type: 'synced' } });
  const model = new ReferenceModel(settings);
  const policy: RolePolicy = {
    roleAnnotation: ROLE_KEY,
    externalIdAnnotation: 'iam.amazonaws.com/external-id',
    defaultRole: settings.defaultRole,
    ...(settings.restrictions
      ? {
          namespaceRestrictions: {
            annotation: ALLOWED_KEY,
            permittedAnnotation: PERMITTED_KEY,
            format: 'glob' as const,
          },
        }
      : {}),
  };
  const cluster = new Map<string, PodRecord>();
  /** What the informer's ListWatch cache holds, by namespace/name: a relist diffs against it. */
  const informerCache = new Map<string, PodRecord>();
  let watchUp = true;
  let uidCounter = 0;
  const lookups: PendingLookup[] = [];
  const problems: string[] = [];
  const pending = () => lookups.filter((l) => !l.answer && !l.cancelled);

  const deliver = (event: IndexEvent) => {
    model.apply(event);
    index.apply(event);
    if (event.resource === 'pods' && (event.event.type === 'upsert' || event.event.type === 'delete')) {
      const pod = event.event.object;
      if (event.event.type === 'upsert') informerCache.set(`${pod.namespace}/${pod.name}`, pod);
      else informerCache.delete(`${pod.namespace}/${pod.name}`);
    }
    for (const waiting of pending()) {
      if (model.known(waiting.ip))
        problems.push(
          `lookup #${waiting.id} for ${waiting.ip} still waits after ${JSON.stringify(event)} made its pod known`,
        );
    }
  };
  const podEvent = (type: 'upsert' | 'delete', pod: PodRecord) => {
    if (watchUp) deliver({ resource: 'pods', event: { type, object: pod } });
  };

  const onAnswer = (entry: PendingLookup, answer: { outcome: LookupOutcome; grant: Grant }) => {
    if (entry.cancelled) problems.push(`cancelled lookup #${entry.id} still answered`);
    entry.answer = answer;
    const { outcome, grant } = answer;
    const owner = model.known(entry.ip);
    if (outcome.kind === 'found') {
      if (outcome.pod.uid !== owner?.uid)
        problems.push(
          `lookup #${entry.id} for ${entry.ip} found pod ${outcome.pod.uid}, but the owner is ${owner?.uid ?? 'nobody'}`,
        );
    } else {
      if (owner) problems.push(`lookup #${entry.id} for ${entry.ip} timed out although ${owner.uid} is known`);
      if (outcome.waitedMs !== entry.holdMs)
        problems.push(`lookup #${entry.id} timed out after ${outcome.waitedMs} ms, not its hold of ${entry.holdMs} ms`);
    }
    const expected = model.expected(entry.ip);
    try {
      assert.deepEqual(actualOf(grant), expected);
    } catch {
      problems.push(
        `lookup #${entry.id} for ${entry.ip}: got ${JSON.stringify(actualOf(grant))}, expected ${JSON.stringify(expected)}`,
      );
    }
  };

  const startLookup = (address: string, holdMs: number) => {
    const entry: PendingLookup = {
      id: lookups.length,
      ip: address,
      holdMs,
      startedAt: scheduler.now(),
      cancelled: false,
    };
    lookups.push(entry);
    entry.subscription = lookup(index, address, { holdMs, needsNamespace: settings.restrictions, scheduler })
      .pipe(map((outcome) => ({ outcome, grant: grantFor(outcome, address, policy, BASE) })))
      .subscribe((answer) => onAnswer(entry, answer));
    const knownNow = model.known(address);
    if (knownNow && !(entry.answer?.outcome.kind === 'found' && entry.answer.outcome.resolvedBy === 'index')) {
      problems.push(`lookup #${entry.id} for ${address} did not answer at once from the index`);
    }
    if (!knownNow && entry.answer)
      problems.push(`lookup #${entry.id} for ${address} answered at once with no known pod`);
  };

  const mutate = (podName: string, change: Partial<PodRecord>) => {
    const current = cluster.get(podName);
    if (!current) return;
    const next = { ...current, ...change };
    cluster.set(podName, next);
    podEvent('upsert', next);
  };

  for (const op of ops) {
    switch (op.kind) {
      case 'create': {
        const previous = cluster.get(op.name);
        if (previous) podEvent('delete', previous);
        const pod = podRecord({
          name: op.name,
          namespace: namespaceOfName(op.name),
          uid: `uid-${op.name}-${++uidCounter}`,
          ips: op.ip ? [op.ip] : [],
          phase: op.phase,
          hostNetwork: op.hostNetwork,
          nodeName: op.onNode ? NODE : 'node-b',
          createdAtMs: op.createdSecond * 1000,
          annotations: op.role === undefined ? {} : { [ROLE_KEY]: op.role },
        });
        cluster.set(op.name, pod);
        podEvent('upsert', pod);
        break;
      }
      case 'update': {
        const current = cluster.get(op.name);
        if (!current) break;
        if ('ip' in op) mutate(op.name, { ips: op.ip ? [op.ip] : [] });
        else if (op.phase !== undefined) mutate(op.name, { phase: op.phase });
        else if (op.hostNetwork !== undefined) mutate(op.name, { hostNetwork: op.hostNetwork });
        else {
          const { [ROLE_KEY]: _old, ...others } = current.annotations;
          mutate(op.name, { annotations: op.role === undefined ? others : { ...others, [ROLE_KEY]: op.role } });
        }
        break;
      }
      case 'delete': {
        const current = cluster.get(op.name);
        if (current) {
          cluster.delete(op.name);
          podEvent('delete', current);
        }
        break;
      }
      case 'watchDown':
        if (watchUp)
          deliver({ resource: 'pods', event: { type: 'disconnected', error: 'connection reset', retryInMs: 100 } });
        watchUp = false;
        break;
      case 'relist': {
        // ListWatch after a 410 or a restart: deletes for cached objects that vanished, then an upsert
        // per listed object (a same-name pod with a new uid arrives as an update).
        for (const [key, cached] of [...informerCache])
          if (!cluster.has(cached.name))
            deliver({ resource: 'pods', event: { type: 'delete', object: informerCache.get(key) as PodRecord } });
        for (const pod of cluster.values()) deliver({ resource: 'pods', event: { type: 'upsert', object: pod } });
        deliver({ resource: 'pods', event: { type: 'synced' } });
        deliver({ resource: 'pods', event: { type: 'watching' } });
        watchUp = true;
        break;
      }
      case 'namespace': {
        const annotations = {
          ...(op.allowed === undefined ? {} : { [ALLOWED_KEY]: op.allowed }),
          ...(op.permitted === undefined ? {} : { [PERMITTED_KEY]: op.permitted }),
        };
        const object: NamespaceRecord = { name: op.name, annotations };
        deliver({ resource: 'namespaces', event: { type: op.present ? 'upsert' : 'delete', object } });
        break;
      }
      case 'lookup':
        startLookup(op.ip, op.holdMs);
        break;
      case 'cancel': {
        const waiting = pending();
        const victim = waiting[op.which % Math.max(1, waiting.length)];
        if (victim) {
          victim.cancelled = true;
          victim.subscription?.unsubscribe();
        }
        break;
      }
      case 'advance': {
        const target = scheduler.now() + op.ms;
        scheduler.schedule(() => undefined, op.ms);
        scheduler.maxFrames = target;
        scheduler.flush();
        for (const waiting of pending()) {
          if (waiting.startedAt + waiting.holdMs <= target)
            problems.push(`lookup #${waiting.id} still waits past its hold`);
        }
        break;
      }
    }
    if (pending().length === 0 && index.waitingKeys() !== 0)
      problems.push(`${index.waitingKeys()} waiting keys with no lookup waiting`);
    if (problems.length > 0) throw new Error(problems.join('\n'));
  }

  scheduler.maxFrames = Number.POSITIVE_INFINITY;
  scheduler.flush();
  if (pending().length > 0) problems.push(`${pending().length} lookups never answered`);
  if (index.waitingKeys() !== 0) problems.push(`${index.waitingKeys()} waiting keys outlive every lookup`);
  for (const entry of lookups) entry.subscription?.unsubscribe();
  if (problems.length > 0) throw new Error(problems.join('\n'));
}

describe('lookup model: never a wrong role', () => {
  it('answers like the reference model over at least 100,000 random operations', (t) => {
    const seed = Number(process.env.MODEL_SEED ?? Date.now() % 2 ** 31);
    const message = `lookup model seed ${seed} (rerun with MODEL_SEED=${seed})`;
    t.diagnostic(message);
    console.log(message);
    let operations = 0;
    const started = performance.now();
    fc.assert(
      fc.property(settingsArbitrary, fc.array(opArbitrary, { maxLength: 400, size: 'max' }), (settings, ops) => {
        operations += ops.length;
        runScenario(settings, ops);
      }),
      { seed, numRuns: 700, includeErrorInReport: true },
    );
    console.log(`lookup model: ${operations} operations in ${Math.round(performance.now() - started)} ms`);
    assert.ok(operations >= 100_000, `only ${operations} operations ran`);
  });
});
