#!/usr/bin/env bash
# The short stress pass of CI (docs/stress.md): a Release build of the stress
# harness, then both backends with and without faults, single-threaded
# (200,000 operations each) and with four threads (8 s each). About a minute
# of running on two cores. Extra arguments go to both runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -x .venv/bin/cmake ]; then PATH="$PWD/.venv/bin:$PATH"; fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
dir=build/stress-release
start=$SECONDS
cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DJAXLAKE_BUILD_TESTS=ON -DJAXLAKE_BUILD_PYTHON=OFF -DJAXLAKE_WERROR=ON \
  >/dev/null
cmake --build "$dir" --parallel "$(nproc 2>/dev/null || echo 2)" --target stress
echo "== stress: built in $((SECONDS - start)) s"
start=$SECONDS
"$dir/stress" --ops 200000 "$@"
"$dir/stress" --threads 4 --seconds 8 "$@"
echo "== stress: ran in $((SECONDS - start)) s"
