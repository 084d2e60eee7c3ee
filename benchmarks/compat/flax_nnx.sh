#!/usr/bin/env bash
# Flax's examples/nnx_toy_examples, unmodified, from the sdist of the Flax
# installed in VENV (pip download --no-binary :all:). 04 shards over
# jax.local_device_count() (run on 2 fake devices), 10 builds a 2x4 mesh
# (8 fake devices); both assign XLA_FLAGS themselves. 05 loads MNIST from
# a hub at run time and is left out. matplotlib draws to Agg.
#   VENV=... benchmarks/compat/flax_nnx.sh [EXAMPLE...]
source "$(dirname "$0")/_env.sh"
VENV="${VENV:-$SRC/venv311}"
ver=$("$VENV/bin/python" -c "import flax; print(flax.__version__)")
dir="$SRC/flax-$ver/examples/nnx_toy_examples"
if [ ! -d "$dir" ]; then
  "$VENV/bin/pip" download -q "flax==$ver" --no-binary :all: --no-deps -d "$SRC"
  tar xzf "$SRC/flax-$ver.tar.gz" -C "$SRC"
fi
export MPLBACKEND=Agg
examples=("$@")
[ ${#examples[@]} -gt 0 ] || examples=(01_functional_api 02_lifted_transforms \
  03_train_state 04_data_parallel_with_jit 06_scan_over_layers \
  07_array_leaves 08_save_load_checkpoints 09_parameter_surgery \
  10_fsdp_and_optimizer hijax_basic hijax_demo)
cd "$dir"
for ex in "${examples[@]}"; do
  count=1
  case "$ex" in
    04_*) count=2 ;;
    10_*) count=8 ;;
  esac
  run_row "flax-nnx-$ex" "$count" "$VENV/bin/python" "$ex.py"
done
