#!/usr/bin/env bash
# MaxText at ~1B: Qwen2.5-1.5B (configs/models/qwen2.5-1.5b.yml, 1.54e9
# parameters) from base.yml, synthetic data, batch 1 a device, sequence
# 1024, attention dot_product, 2 steps, on 1 and 2 fake devices (its
# default layout), each with an empty compilation cache. abort_on_nan_loss
# as in maxtext.sh.
#   VENV=... benchmarks/compat/maxtext_1b.sh
source "$(dirname "$0")/_env.sh"
VENV="${VENV:-$SRC/venv312}"
cfg=$("$VENV/bin/python" -c "import maxtext, os; print(os.path.join(os.path.dirname(maxtext.__file__), 'configs/base.yml'))")
out="$SRC/maxtext-out"
for n in 1 2; do
  rm -rf "$out/jax_cache_1b_$n"
  run_row "maxtext-qwen2.5-1.5b-${n}dev" "$n" "$VENV/bin/python" -m maxtext.trainers.pre_train.train \
    "$cfg" model_name=qwen2.5-1.5b hardware=gpu attention=dot_product \
    dataset_type=synthetic per_device_batch_size=1 max_target_length=1024 \
    steps=2 enable_checkpointing=false abort_on_nan_loss=false \
    run_name="q15b$n" base_output_directory="$out" \
    jax_cache_dir="$out/jax_cache_1b_$n"
done
