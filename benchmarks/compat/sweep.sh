#!/usr/bin/env bash
# Small JAX programs of the kinds third-party code is made of (sweep/*.py:
# flax.linen + optax with remat policies, pmap and shard_map collectives,
# host callbacks, the profiler, the persistent compilation cache, orbax's
# async checkpoints, while-loop and diffrax ODE solves, threads,
# clear_caches, pinned_host, donation, live stats, multiprocessing
# children, exit with work in flight, jax.distributed over two processes),
# each run under the lake
# (`jaxlake run --fake-gpu`) and under XLA's own allocator (`--no-lake`),
# with a time limit. One verdict line per run: PASS, FAIL or HANG, the exit
# status, seconds, the fake's "not supported" lines, XLA's E lines, and
# the lake's report for device 0 (served, forwarded, captured, peak in use,
# peak reserved, U, stitches).
#   benchmarks/compat/sweep.sh [PROGRAM...]
# VENV: the venv that runs them (default: the checkout's .venv, whose test
# extra brings jax, flax, optax and orbax-checkpoint). DIFFRAX_VENV: a venv
# with diffrax (install_sweep.sh makes one over VENV without touching it);
# without one the diffrax row is skipped. LIMIT: seconds a run may take
# (default 300). MODES: any of "lake nolake cpu" (default "lake nolake";
# cpu runs the program on JAX's CPU backend without jaxlake, to tell a
# program's or JAX's own failure from the fake's or the lake's).
source "$(dirname "$0")/_env.sh"
VENV="${VENV:-$REPO/.venv}"
DIFFRAX_VENV="${DIFFRAX_VENV:-$SRC/venv-diffrax}"
LIMIT="${LIMIT:-300}"
MODES="${MODES:-lake nolake}"
progs=("$@")
[ ${#progs[@]} -gt 0 ] || progs=(linen_remat pmap_collectives \
  shard_map_collectives host_callbacks profiler_trace compile_cache \
  orbax_async while_ode diffrax_ode threads_dispatch clear_caches_loop \
  pinned_host donation live_stats multiproc exit_live exit_daemon \
  distributed)
jaxver=$("$VENV/bin/python" -c "import jax; print(jax.__version__)" 2>/dev/null)
echo "jax $jaxver, venv $VENV"
for prog in "${progs[@]}"; do
  counts=1
  args=()
  py="$VENV/bin/python"
  case "$prog" in
    pmap_collectives|shard_map_collectives) counts="2 4" ;;
    live_stats|threads_dispatch) counts=2 ;;
    diffrax_ode)
      py="$DIFFRAX_VENV/bin/python"
      if ! "$py" -c "import diffrax" > /dev/null 2>&1; then
        echo "SKIP $prog: no diffrax in $DIFFRAX_VENV (install_sweep.sh)"
        continue
      fi ;;
  esac
  for count in $counts; do
    for mode in $MODES; do
      [ "$prog" = compile_cache ] && args=("$(mktemp -d)")
      [ "$prog" = distributed ] && args=("$((20000 + RANDOM % 20000))")
      log="$LOGS/sweep-$prog-$mode-$count.log"
      start=$(date +%s)
      case "$mode" in
        cpu) JAX_PLATFORMS=cpu timeout -k 10 "$LIMIT" "$py" \
               "$HERE/sweep/$prog.py" "${args[@]}" > "$log" 2>&1 ;;
        nolake) timeout -k 10 "$LIMIT" "$VENV/bin/jaxlake" run --fake-gpu \
               --fake-gpu-count "$count" --no-lake -- \
               "$py" "$HERE/sweep/$prog.py" "${args[@]}" > "$log" 2>&1 ;;
        *) timeout -k 10 "$LIMIT" "$VENV/bin/jaxlake" run --fake-gpu \
               --fake-gpu-count "$count" -- \
               "$py" "$HERE/sweep/$prog.py" "${args[@]}" > "$log" 2>&1 ;;
      esac
      rc=$?
      secs=$(( $(date +%s) - start ))
      verdict=FAIL
      [ "$rc" -eq 0 ] && grep -q "^OK $prog" "$log" && verdict=PASS
      [ "$rc" -eq 124 ] && verdict=HANG
      # under the lake, a run that printed no lake report did not use it
      if [ "$mode" = lake ] && [ "$verdict" = PASS ] &&
         ! grep -q "^jaxlake: lake report" "$log"; then
        verdict="FAIL (no lake report)"
      fi
      nsup=$(grep -c "not supported" "$log")
      elines=$(grep -cE "^E[0-9]{4} " "$log")
      lake=$(grep -A2 "^jaxlake: lake report" "$log" | sed -n 3p | tr -s ' ')
      echo "$verdict $prog [$mode, $count dev] exit $rc, ${secs} s," \
        "not-supported $nsup, E lines $elines${lake:+, lake:$lake}"
      if [ "$verdict" != PASS ]; then
        grep -E "Error|error:|ERROR|not supported|E[0-9]{4} |Abort|terminate|FATAL" \
          "$log" | grep -v "Nvml call failed" | tail -n 3 | sed 's/^/    /'
      fi
    done
  done
done
