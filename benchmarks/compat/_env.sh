# Sourced by the scripts beside it. VENV: the venv to run in (made by
# install_jax010.sh or install_maxtext.sh); LOGS: where each run's output
# goes (one file a run). run_row NAME COUNT CMD... runs CMD under
# `jaxlake run --fake-gpu` on COUNT fake devices, keeps its output in
# $LOGS/NAME.log, and prints NAME, the exit status and the lake's exit report.
# CONTROL=1 runs the same command without jaxlake on JAX's CPU backend
# (JAX_PLATFORMS=cpu), into $LOGS/NAME.cpu.log: a failure there is the
# program's own.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
SRC="${SRC:-$HOME/.cache/jaxlake-compat}"
LOGS="${LOGS:-$SRC/logs}"
mkdir -p "$SRC" "$LOGS"

run_row() {
  local name="$1" count="$2"; shift 2
  local log="$LOGS/$name.log" rc start end
  start=$(date +%s)
  if [ "${CONTROL:-0}" = 1 ]; then
    log="$LOGS/$name.cpu.log"
    echo "== $name (CPU, no jaxlake): $*" > "$log"
    JAX_PLATFORMS=cpu "$@" >> "$log" 2>&1
    rc=$?
  else
    echo "== $name ($count device(s)): $*" > "$log"
    "$VENV/bin/jaxlake" run --fake-gpu --fake-gpu-count "$count" -- "$@" \
      >> "$log" 2>&1
    rc=$?
  fi
  end=$(date +%s)
  echo "== exit $rc, $((end - start)) s" >> "$log"
  echo "$name: exit $rc ($((end - start)) s), log $log"
  grep -A "$((count + 3))" "^jaxlake: lake report" "$log" | head -n 20 || true
  [ "$rc" -eq 0 ] || grep -E "Error|error:|ERROR|not supported|E[0-9]{4} " \
    "$log" | grep -v "Nvml call failed" | tail -n 5
  return 0
}
