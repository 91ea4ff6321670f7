/**
 * kube2iam 0.15, built from source through the kit in ../shared/peers/kube2iam (HOWTO.md there):
 * the peer the bench measures and the migration test replaces.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** The kit sits in the shared folder beside the clone, or beside the folder of work trees. */
const KUBE2IAM_KIT =
  ['../../shared/peers/kube2iam/', '../../../shared/peers/kube2iam/']
    .map((path) => fileURLToPath(new URL(path, import.meta.url)))
    .find((dir) => existsSync(`${dir}build.sh`)) ??
  fileURLToPath(new URL('../../shared/peers/kube2iam/', import.meta.url));
/** Where .ci/run builds it ($KUBE2IAM_BINARY, default ../kube2iam/kube2iam beside the clone, as COMMON.md says). */
export const KUBE2IAM_BINARY =
  process.env.KUBE2IAM_BINARY ?? fileURLToPath(new URL('../../kube2iam/kube2iam', import.meta.url));

/** The kube2iam binary, built through the kit's build.sh when missing; otherwise why not. */
export function kube2iamBinary(): { binary: string } | { skipped: string } {
  const works = () =>
    spawnSync(KUBE2IAM_BINARY, ['--version'], { encoding: 'utf8' }).stdout?.includes('0.15.0') ?? false;
  if (existsSync(KUBE2IAM_BINARY) && works()) return { binary: KUBE2IAM_BINARY };
  if (!existsSync(`${KUBE2IAM_KIT}build.sh`)) return { skipped: `no kube2iam kit at ${KUBE2IAM_KIT}` };
  const build = spawnSync('bash', [`${KUBE2IAM_KIT}build.sh`, KUBE2IAM_BINARY], {
    encoding: 'utf8',
    timeout: 15 * 60_000,
  });
  if (build.status === 0 && works()) return { binary: KUBE2IAM_BINARY };
  return {
    skipped: `kube2iam did not build (bash ${KUBE2IAM_KIT}build.sh exited with ${build.status}): ${(build.stderr ?? '').trim().split('\n').slice(-3).join(' / ')}`,
  };
}
