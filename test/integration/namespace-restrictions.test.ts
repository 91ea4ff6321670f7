/**
 * Namespace restrictions end to end, as kube2iam users configure them: the Namespace lists the
 * roles its pods may have; any other role is a 403 with the reason, an audit event and a
 * RoleDenied Event on the pod in the API server.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentHarness, imdsGet } from '../fixtures/agent.js';
import { eventually } from '../../testkit/eventually.js';
import type { NetnsPod } from '../fixtures/netns.js';

const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';
const ALLOWED = 'iam.amazonaws.com/allowed-roles';
/** Long enough that a namespace created while a request waits always lands inside the window, even on a loaded machine. */
const GRACE_WINDOW_MS = 1_500;

interface RecordedEvent {
  readonly reason: string;
  readonly message: string;
  readonly type: string;
  readonly metadata: { readonly namespace: string };
  readonly involvedObject: {
    readonly kind: string;
    readonly namespace: string;
    readonly name: string;
    readonly uid?: string;
  };
}

describe('namespace restrictions (BROKER_NAMESPACE_RESTRICTIONS=true)', () => {
  let harness: AgentHarness;
  let allowed: NetnsPod;
  let forbidden: NetnsPod;
  let homeless: NetnsPod;
  let broken: NetnsPod;

  before(async () => {
    harness = await AgentHarness.create();
    [allowed, forbidden, homeless, broken] = await Promise.all([
      harness.addNetnsPod('allowed'),
      harness.addNetnsPod('forbidden'),
      harness.addNetnsPod('homeless'),
      harness.addNetnsPod('broken'),
    ]);
    harness.api.upsertNamespace({ metadata: { name: 'team', annotations: { [ALLOWED]: '["app-*"]' } } });
    harness.api.upsertNamespace({ metadata: { name: 'sloppy', annotations: { [ALLOWED]: 'app-*' } } });
    harness.schedulePod({ name: 'allowed', namespace: 'team', role: 'app-reader', ip: allowed.ip });
    harness.schedulePod({ name: 'forbidden', namespace: 'team', role: 'admin', ip: forbidden.ip });
    harness.schedulePod({ name: 'homeless', namespace: 'nowhere', role: 'app-reader', ip: homeless.ip });
    harness.schedulePod({ name: 'broken', namespace: 'sloppy', role: 'app-reader', ip: broken.ip });
    await harness.startAgent({
      BROKER_NAMESPACE_RESTRICTIONS: 'true',
      BROKER_GRACE_WINDOW_MS: String(GRACE_WINDOW_MS),
    });
    await harness.waitUntilReady();
  });
  after(() => harness?.stop());

  const eventsOn = (pod: string) =>
    (harness.api.createdEvents as RecordedEvent[]).filter((event) => event.involvedObject.name === pod);
  const waitForEvent = async (pod: string): Promise<RecordedEvent> => {
    await eventually('a RoleDenied Event is posted', () => eventsOn(pod).length > 0);
    return eventsOn(pod)[0] as RecordedEvent;
  };

  it('serves a role the namespace allows', async () => {
    const response = await imdsGet(allowed, `${harness.imdsEndpoint}${CREDENTIALS}app-reader`);
    assert.equal(response.status, 200);
    assert.match(response.body, /"AccessKeyId"/);
  });

  it('refuses any other role with 403 and the reason, an audit event, and a RoleDenied Event on the pod', async () => {
    const response = await imdsGet(forbidden, `${harness.imdsEndpoint}${CREDENTIALS}admin`);
    assert.equal(response.status, 403);
    assert.match(
      response.body,
      /role arn:aws:iam::123456789012:role\/admin is not allowed by namespace team annotation iam\.amazonaws\.com\/allowed-roles/,
    );
    const denied = await harness.nextEvent((event) => event.type === 'credential.denied' && event.pod === 'forbidden');
    assert.equal(denied.type === 'credential.denied' && denied.status, 403);
    assert.ok(
      harness.logs.some((line) => line.includes('"event":"credential.denied"') && line.includes('"pod":"forbidden"')),
      'a log line for the denial',
    );
    const event = await waitForEvent('forbidden');
    assert.equal(event.reason, 'RoleDenied');
    assert.equal(event.type, 'Warning');
    assert.equal(event.metadata.namespace, 'team');
    assert.deepEqual(
      { kind: event.involvedObject.kind, namespace: event.involvedObject.namespace },
      { kind: 'Pod', namespace: 'team' },
    );
    assert.equal(
      event.involvedObject.uid,
      harness.api.pods().find((pod) => pod.metadata.name === 'forbidden')?.metadata.uid,
    );
    assert.match(event.message, /not allowed by namespace team/);
  });

  it('waits for an unknown namespace like for an unknown pod, then denies', async () => {
    const started = Date.now();
    const response = await imdsGet(homeless, `${harness.imdsEndpoint}${CREDENTIALS}`);
    assert.equal(response.status, 403);
    assert.ok(Date.now() - started >= GRACE_WINDOW_MS, 'held for the grace window');
    assert.match(response.body, /namespace nowhere is not known/);
  });

  it('a namespace that appears while the request waits resolves it', async () => {
    const pending = imdsGet(homeless, `${harness.imdsEndpoint}${CREDENTIALS}`);
    await eventually('the lookup waits for the namespace', () => harness.agent.index.waitingKeys() > 0);
    harness.api.upsertNamespace({ metadata: { name: 'nowhere', annotations: { [ALLOWED]: '["app-reader"]' } } });
    const response = await pending;
    assert.equal(response.status, 200);
    assert.equal(response.body, 'app-reader');
  });

  it('denies on an annotation that is not a JSON array, saying so', async () => {
    const response = await imdsGet(broken, `${harness.imdsEndpoint}${CREDENTIALS}`);
    assert.equal(response.status, 403);
    assert.match(response.body, /not valid JSON/);
  });

  it('logs a 403 from the API server on posting Events once, at warn, and still answers', async () => {
    // A different allow-list each time, so every denial has a new message and tries to post an Event; the API server refuses them all.
    for (const pattern of ['nothing', 'nothing-else']) {
      const annotation = JSON.stringify([pattern]);
      harness.api.upsertNamespace({ metadata: { name: 'team', annotations: { [ALLOWED]: annotation } } });
      await eventually(
        'the agent sees the namespace annotation',
        () => harness.agent.index.view.namespace('team')?.annotations[ALLOWED] === annotation,
      );
      harness.api.failRequests(1, 403);
      const response = await imdsGet(allowed, `${harness.imdsEndpoint}${CREDENTIALS}app-reader`);
      assert.equal(response.status, 403);
      await eventually('the Event POST reached the API server', () =>
        harness.api.requests.some((request) => request.method === 'POST' && JSON.stringify(request).includes(pattern)),
      );
    }
    const warnings = harness.logs.filter((line) => line.includes('not allowed to create Events'));
    assert.equal(warnings.length, 1);
    assert.equal(JSON.parse(warnings[0] as string).level, 40);
  });
});
