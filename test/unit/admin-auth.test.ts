import assert from 'node:assert/strict';
import type { IncomingMessage } from 'node:http';
import { describe, it } from 'node:test';
import {
  assertAdminProtected,
  bearerAuthorizer,
  isLoopbackListen,
  isProtectedAdminPath,
} from '../../src/admin/auth.js';
import { ConfigError } from '../../src/config/load.js';

const withAuthorization = (authorization?: string, remoteAddress = '127.0.0.1') =>
  ({ headers: authorization === undefined ? {} : { authorization }, socket: { remoteAddress } }) as IncomingMessage;

describe('admin access', () => {
  it('knows loopback listeners from the others', () => {
    for (const address of ['127.0.0.1:8182', '127.1.2.3:1', '[::1]:8182', 'localhost:8182'])
      assert.ok(isLoopbackListen(address), address);
    for (const address of ['0.0.0.0:8182', '[::]:8182', '10.0.0.1:8182', 'node.example:8182', '128.0.0.1:1'])
      assert.ok(!isLoopbackListen(address), address);
  });

  it('refuses a listener beyond loopback without a token, naming the variable', () => {
    assert.throws(
      () => assertAdminProtected('0.0.0.0:8182', undefined),
      (error: unknown) => error instanceof ConfigError && /BROKER_ADMIN_TOKEN/.test(error.message),
    );
    assert.doesNotThrow(() => assertAdminProtected('0.0.0.0:8182', 'a-long-enough-token'));
    assert.doesNotThrow(() => assertAdminProtected('127.0.0.1:8182', undefined));
  });

  it('accepts exactly the bearer token', () => {
    const authorized = bearerAuthorizer('a-long-enough-token');
    assert.ok(authorized(withAuthorization('Bearer a-long-enough-token')));
    for (const header of [
      undefined,
      '',
      'Bearer ',
      'Bearer a-long-enough-tokenX',
      'bearer a-long-enough-token',
      'Basic a-long-enough-token',
      'Bearer a',
    ]) {
      assert.ok(!authorized(withAuthorization(header)), String(header));
    }
  });

  it('without a token, trusts only loopback peers (a pod reaching 127.0.0.1 through route_localnet sends from its own address)', () => {
    const authorized = bearerAuthorizer(undefined);
    for (const peer of ['127.0.0.1', '127.9.9.9', '::1', '::ffff:127.0.0.1'])
      assert.ok(authorized(withAuthorization(undefined, peer)), peer);
    for (const peer of ['10.200.1.2', '::ffff:10.0.0.5', '169.254.169.254', 'fd00::1', ''])
      assert.ok(!authorized(withAuthorization(undefined, peer)), peer);
  });

  it('guards the event stream and the debug pages, not the probes', () => {
    assert.deepEqual(['/events', '/debug/pods', '/healthz', '/readyz'].map(isProtectedAdminPath), [
      true,
      true,
      false,
      false,
    ]);
  });
});
