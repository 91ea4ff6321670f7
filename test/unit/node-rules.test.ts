/** The rules the agent writes, and what node-cleanup knows to remove, as iptables arguments. */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { nodeArtifacts } from '../../src/node/cleanup.js';
import { dnatRule, guardRule, ipv6Binary } from '../../src/node/iptables.js';
import { nodeHasIpv6 } from '../../src/node/ipv6.js';

const TRAFFIC = { metadataAddress: '169.254.169.254', metadataPort: 80, hostInterface: 'eni+' };

describe('node rules', () => {
  it('redirect and guard match the same packets: the guard resets what the redirect did not take', () => {
    const dnat = dnatRule({ ...TRAFFIC, agentAddress: '10.0.1.23', agentPort: 8181 }).join(' ');
    const guard = guardRule(TRAFFIC).join(' ');
    const match = '-d 169.254.169.254/32 -i eni+ -p tcp --dport 80';
    assert.ok(dnat.startsWith(match) && guard.startsWith(match), `${dnat}\n${guard}`);
    assert.match(dnat, /-j DNAT --to-destination 10\.0\.1\.23:8181$/);
    assert.match(guard, /-j REJECT --reject-with tcp-reset$/);
  });

  it('guard IPv6 as a /128 and negate an interface with !', () => {
    assert.deepEqual(guardRule({ ...TRAFFIC, metadataAddress: 'fd00:ec2::254', hostInterface: '!eth0' }).slice(0, 5), [
      '-d',
      'fd00:ec2::254/128',
      '!',
      '-i',
      'eth0',
    ]);
  });

  it('use the same backend for IPv6 as for IPv4', () => {
    assert.equal(ipv6Binary('iptables'), 'ip6tables');
    assert.equal(ipv6Binary('iptables-legacy'), 'ip6tables-legacy');
    assert.equal(ipv6Binary('/usr/sbin/iptables-nft'), '/usr/sbin/ip6tables-nft');
    assert.equal(ipv6Binary('/opt/iptables/bin/iptables'), '/opt/iptables/bin/ip6tables', 'only the file name changes');
  });

  it('node-cleanup covers both chains in both backends and both address families (auto), or the named binary', () => {
    const names = nodeArtifacts('auto', 'kube-iam-broker').map((artifact) => artifact.name);
    assert.ok(names.includes('ip link kube-iam-broker'), "the container door's dummy link");
    for (const binary of ['iptables-legacy', 'iptables-nft', 'ip6tables-legacy', 'ip6tables-nft']) {
      assert.ok(names.includes(`${binary} -t nat KUBE-IAM-BROKER`), `${binary} nat`);
      assert.ok(names.includes(`${binary} -t filter KUBE-IAM-BROKER-GUARD`), `${binary} guard`);
    }
    assert.deepEqual(
      nodeArtifacts('/sbin/iptables', 'off').map((artifact) => artifact.name.split(' ')[0]),
      ['/sbin/iptables', '/sbin/iptables', '/sbin/ip6tables', '/sbin/ip6tables'],
    );
  });

  it('see IPv6 on a node only when its kernel lists IPv6 addresses', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kib-ipv6-'));
    try {
      await writeFile(join(dir, 'with'), '00000000000000000000000000000001 01 80 10 80       lo\n');
      await writeFile(join(dir, 'disabled'), '');
      assert.equal(await nodeHasIpv6(join(dir, 'with')), true);
      assert.equal(await nodeHasIpv6(join(dir, 'disabled')), false, 'IPv6 disabled on every interface');
      assert.equal(await nodeHasIpv6(join(dir, 'absent')), false, 'booted with ipv6.disable=1');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
