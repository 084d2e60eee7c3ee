#!/usr/bin/env bash
# The GPU check of jaxlake (benchmarks/gpu/gpu_check.py), on a machine with
# an NVIDIA GPU and driver. Installs the package from this checkout without
# network (the build tools and jax must already be installed), then runs
# the check; the results go to $OUT (or ./gpu-check). Aim: under 8 minutes
# on an H200. Usage: benchmarks/gpu/check.sh [gpu_check.py arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "no NVIDIA GPU here (nvidia-smi not found): nothing to check" >&2
  exit 0
fi
python3 -m pip install -q --no-build-isolation --no-deps . >/dev/null
exec python3 benchmarks/gpu/gpu_check.py --steps 40 "$@"
