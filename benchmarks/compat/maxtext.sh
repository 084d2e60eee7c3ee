#!/usr/bin/env bash
# MaxText's GPU smoke config (configs/gpu/gpu_smoke_test.yml: synthetic
# data, 8 tiny layers) on 1, 2 and 8 fake devices (COUNTS="1 2 8"), its
# default layout (fsdp over all devices), checkpointing off, 5 steps.
# Kernels do not run on the fake, so the loss is whatever the output
# buffer held (NaN here), and
# MaxText's default abort_on_nan_loss=true stops after step 0:
# abort_on_nan_loss=false lets it train its steps. MaxText keeps a
# persistent compilation cache (jax_cache_dir, ~/jax_cache by default); a
# run that finds its programs there neither compiles nor autotunes, and
# allocates less. Each row gets an empty cache, so it measures a first run.
#   VENV=... [COUNTS="1 2 8"] benchmarks/compat/maxtext.sh
source "$(dirname "$0")/_env.sh"
VENV="${VENV:-$SRC/venv312}"
cfg=$("$VENV/bin/python" -c "import maxtext, os; print(os.path.join(os.path.dirname(maxtext.__file__), 'configs/gpu/gpu_smoke_test.yml'))")
out="$SRC/maxtext-out"
for n in ${COUNTS:-1 2 8}; do
  rm -rf "$out/jax_cache_$n"
  run_row "maxtext-smoke-${n}dev" "$n" "$VENV/bin/python" -m maxtext.trainers.pre_train.train \
    "$cfg" run_name="smoke$n" base_output_directory="$out" \
    enable_checkpointing=false steps=5 abort_on_nan_loss=false \
    jax_cache_dir="$out/jax_cache_$n"
done
