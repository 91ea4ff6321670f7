#!/usr/bin/env bash
# Runs a command (normally the test runner) inside throwaway Linux namespaces, so tests can build
# bridges, veths and network namespaces for fake pods without touching the host:
#   network namespace: only loopback plus what the tests create; no route leads off the machine.
#   mount namespace:   /run/netns (where `ip netns` keeps its handles) is a tmpfs only we see.
#   PID namespace:     when the command exits, the kernel kills every process it left behind
#                      (moto, an agent, a client in a pod), so the namespaces really die with it.
# Usage: bash test/hermetic.sh <command...>
#   e.g. bash test/hermetic.sh npx tsx --test test/integration/*.test.ts
set -euo pipefail

die() {
  echo "test/hermetic.sh: $*" >&2
  exit 1
}

# First pass (on the host): check prerequisites and re-execute this script inside new namespaces.
if [[ "${_KIB_HERMETIC_INSIDE:-}" != 1 ]]; then
  (($# > 0)) || die "usage: bash test/hermetic.sh <command...>"
  ((EUID == 0)) || die "must run as root (it creates namespaces, bridges and veths); try: sudo bash test/hermetic.sh $*"
  for tool in unshare ip mount; do
    command -v "$tool" >/dev/null || die "'$tool' not found; install it: apt-get install -y util-linux iproute2 mount"
  done
  # --kill-child: if unshare itself is killed, the namespace's init (and so everything in it) dies too.
  _KIB_HERMETIC_INSIDE=1 exec unshare --mount --net --pid --fork --kill-child --mount-proc \
    -- bash "$(realpath "${BASH_SOURCE[0]}")" "$@"
fi

# Second pass: we are PID 1 of the new namespaces.
unset _KIB_HERMETIC_INSIDE # a nested run must build namespaces of its own
mount --make-rprivate /    # nothing mounted from here on leaks back to the host
mkdir -p /run/netns
mount -t tmpfs none /run/netns
ip link set lo up
export KIB_HERMETIC=1
# Run the command as a child rather than exec it: this shell stays PID 1, reaps orphans,
# and its exit is what tears the namespaces down.
"$@"
