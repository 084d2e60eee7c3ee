#!/usr/bin/env bash
# The GPU check of jaxlake, in one command (benchmarks/gpu/README.md):
#
#   benchmarks/gpu/check.sh [gpu_check.py arguments, e.g. --sanitizer]
#   benchmarks/gpu/check.sh --only env,latency   # the driver model's
#       constants alone: $OUT/latency.json feeds
#       `jaxlake bench --driver-model $OUT/latency.json`
#   benchmarks/gpu/check.sh --only env,pool      # the driver pool's
#       granularity alone: $OUT/pool_probe.json (pool_probe.py)
#
# About five minutes on an H200, never more than ten: the install (an
# incremental build after the first) and then gpu_check.py with what is
# left of a 570-second budget. Results go to $OUT (default ./gpu-check):
# summary.json, rewritten as each step finishes, and one log per step.
#
# No network is needed: jax, its CUDA plugin, flax, optax, nanobind,
# scikit-build-core, cmake and a C++ compiler must be installed already.
# Under a system Python that refuses pip (PEP 668) the package goes into a
# virtual environment that sees the system's packages
# ($JAXLAKE_GPU_VENV, default ./.venv-gpu).
#
# Exit status: 0 passed, 1 a step failed, 2 cannot install (what is missing
# is printed), 3 no GPU here, 4 out of time.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
START=$SECONDS
OUT=${OUT:-$PWD/gpu-check}
mkdir -p "$OUT"
export OUT
PY=${PYTHON:-python3}

no_gpu() {
  echo "no GPU: $1; the GPU check needs an NVIDIA GPU and its driver" >&2
  printf '{"status": "no GPU: %s", "steps": {}, "failures": []}\n' \
    "$(echo "$1" | tr -d '"\\')" > "$OUT/summary.json"
  exit 3
}
command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi not found"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || no_gpu "nvidia-smi lists no GPU"

command -v "$PY" >/dev/null 2>&1 || { echo "check.sh: no $PY" >&2; exit 2; }
# What the offline install needs, all reported at once.
missing=$("$PY" - <<'PYEOF'
import importlib.util, shutil
need = {"jax": "jax", "jaxlib": "jaxlib", "flax": "flax", "optax": "optax",
        "nanobind": "nanobind", "scikit_build_core": "scikit-build-core",
        "numpy": "numpy"}
out = [dist for mod, dist in need.items()
       if importlib.util.find_spec(mod) is None]
if not (importlib.util.find_spec("jax_plugins") or
        importlib.util.find_spec("jax_cuda13_plugin") or
        importlib.util.find_spec("jax_cuda12_plugin")):
    out.append("a jax CUDA plugin (jax-cuda13-plugin)")
if not (shutil.which("cmake") or importlib.util.find_spec("cmake")):
    out.append("cmake")
if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
    out.append("a C++ compiler (c++, g++ or clang++)")
print(", ".join(out))
PYEOF
)
if [ -n "$missing" ]; then
  echo "check.sh: cannot install jaxlake offline; missing: $missing" >&2
  exit 2
fi

# Install: into the current Python if pip may write there, else into a
# virtual environment with the system's site packages. No -Werror: the
# compiler here is unknown.
PIP_ARGS=(install -q --no-build-isolation --no-deps
          --config-settings=cmake.define.JAXLAKE_WERROR=OFF .)
log="$OUT/install.log"
if "$PY" -m pip "${PIP_ARGS[@]}" >"$log" 2>&1; then
  RUN_PY=$PY
else
  VENV=${JAXLAKE_GPU_VENV:-$PWD/.venv-gpu}
  echo "check.sh: pip refused the system Python (see $log); using $VENV" >&2
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv --system-site-packages "$VENV" >>"$log" 2>&1 || {
      echo "check.sh: cannot create $VENV (python3-venv missing?)" >&2
      exit 2; }
  fi
  RUN_PY=$VENV/bin/python
  "$RUN_PY" -m pip "${PIP_ARGS[@]}" >>"$log" 2>&1 || {
    echo "check.sh: installing jaxlake failed; the end of $log:" >&2
    tail -20 "$log" >&2
    exit 2; }
fi
elapsed=$((SECONDS - START))
budget=$((570 - elapsed))
if [ "$budget" -lt 120 ]; then
  echo "check.sh: the install took ${elapsed}s; too little time left" >&2
  exit 4
fi
echo "check.sh: installed in ${elapsed}s; checking with a ${budget}s budget"
# gpu_check.py stops starting steps when its budget runs out; timeout is
# the backstop, so the whole command never runs past ten minutes.
cd /tmp || exit 2
timeout --kill-after=10 $((budget + 20)) \
  "$RUN_PY" "$OLDPWD/benchmarks/gpu/gpu_check.py" --out "$OUT" \
  --budget "$budget" "$@"
status=$?
[ "$status" -eq 124 ] && status=4
echo "check.sh: status $status after $((SECONDS - START))s; $OUT/summary.json"
exit "$status"
