/** When the agent may answer from its index, and how long a silently dead watch can go unnoticed. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { PodIndex, indexDoubt } from '../../src/broker/pod-index.js';
import { DEFAULT_WATCH_DEADLINE_SECONDS, watchTimeoutWithin } from '../../src/cluster/informer.js';
import { loadConfig } from '../../src/config/load.js';

const informer = (resource: 'pods' | 'namespaces', type: 'synced' | 'watching') =>
  ({ resource, event: { type } }) as const;
const disconnected = (resource: 'pods' | 'namespaces') =>
  ({ resource, event: { type: 'disconnected', error: 'socket hang up', retryInMs: 100 } }) as const;

describe('index trust', () => {
  it('is doubted from a failed watch until the informer watches again, naming the failure', () => {
    const index = new PodIndex('node-a');
    assert.equal(
      indexDoubt(index, ['pods']),
      undefined,
      'before the first list nothing is known, so nothing is doubted',
    );
    index.apply(informer('pods', 'synced'));
    index.apply(informer('pods', 'watching'));
    assert.equal(indexDoubt(index, ['pods']), undefined);
    index.apply(disconnected('pods'));
    assert.match(indexDoubt(index, ['pods']) ?? '', /cannot vouch for its pods index .*socket hang up.*retry/);
    index.apply(informer('pods', 'watching'));
    assert.equal(indexDoubt(index, ['pods']), undefined, 'caught up');
  });

  it('covers only the resources that decide roles', () => {
    const index = new PodIndex('node-a');
    index.apply(informer('pods', 'watching'));
    index.apply(disconnected('namespaces'));
    assert.equal(indexDoubt(index, ['pods']), undefined, 'namespaces do not matter without namespace restrictions');
    assert.match(indexDoubt(index, ['pods', 'namespaces']) ?? '', /namespaces index/);
  });

  it('notices a silent watch within the deadline: the server ends it at five sixths, the agent gives up at the deadline', () => {
    assert.equal(loadConfig([], {}).watchDeadlineSeconds, DEFAULT_WATCH_DEADLINE_SECONDS);
    assert.deepEqual(watchTimeoutWithin(30), { serverSeconds: 25, graceMs: 5_000 });
    for (const seconds of [2, 3, 7, 30, 600]) {
      const { serverSeconds, graceMs } = watchTimeoutWithin(seconds);
      assert.ok(Number.isInteger(serverSeconds) && serverSeconds >= 1, 'timeoutSeconds is a whole number of seconds');
      assert.ok(graceMs >= 500, 'the server has time to end the watch itself');
      assert.ok(
        serverSeconds * 1000 + graceMs <= Math.max(seconds * 1000, 1_500),
        `${seconds} s: noticed within the deadline`,
      );
    }
  });
});
