#!/usr/bin/env bash
# Builds the C++ tests and the stress harness with sanitizers and runs them:
# AddressSanitizer+UndefinedBehaviorSanitizer, then ThreadSanitizer
# (docs/stress.md). Any report fails the run. Usage:
#   .ci/sanitize.sh [address,undefined|thread ...]   (default: both builds)
# CMake and Ninja come from the environment (the test extra of pyproject.toml
# installs both into .venv, which is put first on PATH when present).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -x .venv/bin/cmake ]; then PATH="$PWD/.venv/bin:$PATH"; fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
jobs=$(nproc 2>/dev/null || echo 2)

# Reports stop the program with a nonzero status (-fno-sanitize-recover=all
# for UBSan; halt_on_error for the others).
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

run() {
  local sanitize=$1 dir=build/sanitize-${1//,/-}
  # The replay engine and its policy models run on one thread: ThreadSanitizer
  # has nothing to check there, so its build leaves their tests out.
  local lake_tests=(lake_alloc_test lake_growth_test lake_stitch_test
    lake_streams_test lake_small_pool_test lake_reclaim_test)
  local tests=(vmm_test "${lake_tests[@]}" trace_test replay_test
    policy_conformance_test)
  if [ "$sanitize" = thread ]; then tests=(vmm_test "${lake_tests[@]}"); fi
  echo "== ${sanitize}: configure and build ${tests[*]} stress"
  local start=$SECONDS
  # -O1, as the sanitizers' documentation advises: about a fifth less
  # compile time than RelWithDebInfo's -O2, stack traces that stay readable.
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" \
    -DJAXLAKE_BUILD_TESTS=ON -DJAXLAKE_BUILD_PYTHON=OFF -DJAXLAKE_WERROR=ON \
    -DJAXLAKE_SANITIZE="$sanitize" >/dev/null
  cmake --build "$dir" --parallel "$jobs" --target "${tests[@]}" stress
  echo "== ${sanitize}: built in $((SECONDS - start)) s"
  for t in "${tests[@]}"; do
    start=$SECONDS
    "$dir/$t" >"$dir/$t.log" 2>&1 || { tail -n 60 "$dir/$t.log"; exit 1; }
    echo "== ${sanitize}: $t: $(tail -n 1 "$dir/$t.log") ($((SECONDS - start)) s)"
  done
  # A shortened stress pass: both backends, with and without faults, one
  # thread then four.
  start=$SECONDS
  "$dir/stress" --ops 20000 --check-every 500
  "$dir/stress" --threads 4 --seconds 3 --check-every 500
  echo "== ${sanitize}: stress in $((SECONDS - start)) s"
}

if [ $# -eq 0 ]; then set -- address,undefined thread; fi
for sanitize in "$@"; do run "$sanitize"; done
echo "== sanitizers: no reports"
