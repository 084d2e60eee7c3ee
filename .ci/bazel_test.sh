#!/usr/bin/env bash
# Builds and tests the C++ core with Bazel, offline (docs/bazel.md):
#   bazel test --config=offline //...
# Installs with apt what is missing: Debian's bazel-bootstrap (Bazel 4.2.3) for
# `bazel`, and cmake, which the shim's build runs (cc/shim/BUILD). Extra
# arguments go to `bazel test`, e.g. `.ci/bazel_test.sh -c dbg`. Stops the
# Bazel server at the end, so that it holds no memory after CI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=()
command -v bazel >/dev/null 2>&1 || packages+=(bazel-bootstrap)
command -v cmake >/dev/null 2>&1 || packages+=(cmake)
if [ "${#packages[@]}" -gt 0 ]; then
  sudo=()
  if [ "$(id -u)" != 0 ]; then sudo=(sudo); fi
  echo "== installing ${packages[*]} with apt"
  start=$SECONDS
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq "${packages[@]}" >/dev/null
  echo "== installed in $((SECONDS - start)) s"
fi

echo "== bazel test --config=offline //... $*"
start=$SECONDS
status=0
bazel test --config=offline --color=no --curses=no //... "$@" || status=$?
echo "== bazel test finished in $((SECONDS - start)) s with status $status"
bazel shutdown >/dev/null 2>&1 || true
exit "$status"
