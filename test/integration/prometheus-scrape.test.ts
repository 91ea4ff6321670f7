/**
 * A real Prometheus (Debian's `prometheus` package) scrapes a running agent's metrics listener,
 * as the manifest's scrape annotations ask it to: the target is up, the standard process metrics
 * and the agent's families are there, and an unknown caller's 503 carries its own bounded reason.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { AgentHarness, imdsGet } from '../fixtures/agent.js';
import { eventually } from '../../testkit/eventually.js';
import { WatchedProcess } from '../fixtures/output-watcher.js';

const CREDENTIALS = '/latest/meta-data/iam/security-credentials/';

const freePort = async (): Promise<number> => {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
};

describe('Prometheus scrapes the metrics listener', () => {
  let harness: AgentHarness;
  let prometheus: WatchedProcess;
  let dir: string;
  let api: string;

  /** One instant-vector query against the real Prometheus: each series' labels and value. */
  const query = async (promql: string): Promise<Array<{ metric: Record<string, string>; value: number }>> => {
    const body = (await (await fetch(`${api}/api/v1/query?query=${encodeURIComponent(promql)}`)).json()) as {
      data: { result: Array<{ metric: Record<string, string>; value: [number, string] }> };
    };
    return body.data.result.map((series) => ({ metric: series.metric, value: Number(series.value[1]) }));
  };

  before(async () => {
    harness = await AgentHarness.create();
    const known = await harness.addNetnsPod('known');
    const stranger = await harness.addNetnsPod('stranger');
    harness.schedulePod({ name: 'known', role: 'app-known', ip: known.ip });
    await harness.startAgent();
    await harness.waitUntilReady();
    assert.equal((await imdsGet(known, `${harness.imdsEndpoint}${CREDENTIALS}app-known`)).status, 200);
    assert.equal((await imdsGet(stranger, `${harness.imdsEndpoint}${CREDENTIALS}`)).status, 503, 'no pod has this IP');

    dir = mkdtempSync(join(tmpdir(), 'prometheus-'));
    const webPort = await freePort();
    api = `http://127.0.0.1:${webPort}`;
    writeFileSync(
      join(dir, 'prometheus.yml'),
      `global: { scrape_interval: 1s, scrape_timeout: 1s }\nscrape_configs:\n  - job_name: kube-iam-broker\n    static_configs: [{ targets: ["127.0.0.1:${harness.agent.metrics.address.port}"] }]\n`,
    );
    prometheus = WatchedProcess.spawn([
      'prometheus',
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${webPort}`,
    ]);
    await eventually(
      'Prometheus has scraped the agent',
      async () => (await query('up{job="kube-iam-broker"}').catch(() => []))[0]?.value === 1,
      30_000,
    );
  });
  after(async () => {
    await prometheus?.stop();
    await harness?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('finds the standard process and Node.js metrics and the build', async () => {
    assert.ok(((await query('process_resident_memory_bytes{job="kube-iam-broker"}'))[0]?.value ?? 0) > 10_000_000);
    assert.equal((await query('nodejs_eventloop_lag_seconds{job="kube-iam-broker"}')).length, 1);
    const [build] = await query('kube_iam_broker_build_info');
    assert.equal(build?.value, 1);
    assert.match(build?.metric.version ?? '', /^\d+\.\d+\.\d+$/);
  });

  it("tells an unknown caller's 503 from other denials by a bounded reason", async () => {
    const denials = await query('kube_iam_broker_credentials_denied_total');
    assert.deepEqual(
      denials.map((series) => [series.metric.status, series.metric.reason, series.value]),
      [['503', 'unknown-pod', 1]],
    );
    const issued = await query('sum(kube_iam_broker_credentials_issued_total)');
    assert.ok((issued[0]?.value ?? 0) >= 1);
  });

  it('serves nothing but /metrics on that listener', async () => {
    const base = `http://127.0.0.1:${harness.agent.metrics.address.port}`;
    for (const path of ['/events', '/debug/pods', '/healthz', '/'])
      assert.equal((await fetch(`${base}${path}`)).status, 404, path);
    assert.equal((await fetch(`${base}/metrics`, { method: 'POST' })).status, 405);
  });
});
