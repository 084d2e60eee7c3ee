#!/usr/bin/env bash
# `jaxlake fit` on MaxText unmodified: the largest per_device_batch_size of
# Qwen2.5-1.5B (the config of maxtext_1b.sh: base.yml, synthetic data,
# sequence 1024, 2 steps) on an H100, with 1 device and with 8 (MaxText's
# default layout: fsdp over all of them; each device is an H100, and the
# fit is the fullest device's). XLA's autotuning is off: on the fake GPU
# it times kernels that do not run, and it is most of a compile's time.
# Each run compiles afresh (`jaxlake fit` turns JAX's persistent
# compilation cache off). The report of each fit goes to
# $FIT/fit-N$TAG.txt, its JSON to $FIT/fit-N$TAG.json, its progress to
# $FIT/fit-N$TAG.log; the traces stay in $FIT/traces-N (a second fit of
# the same command reuses them, over any range).
#   VENV=... DEVICES="1 8" VARY=batch=1..128 POLICIES=models TAG= \
#     benchmarks/compat/maxtext_fit.sh
source "$(dirname "$0")/_env.sh"
VENV="${VENV:-$SRC/venv312}"
FIT="${FIT:-$SRC/maxtext-fit}"
DEVICES="${DEVICES:-1 8}"
VARY="${VARY:-batch=1..128}"
POLICIES="${POLICIES:-models}"
TAG="${TAG:-}"
cfg=$("$VENV/bin/python" -c "import maxtext, os; print(os.path.join(os.path.dirname(maxtext.__file__), 'configs/base.yml'))")
out="$SRC/maxtext-out"
mkdir -p "$FIT"
for n in $DEVICES; do
  start=$(date +%s)
  PATH="$VENV/bin:$PATH" XLA_FLAGS="--xla_gpu_autotune_level=0" \
    "$VENV/bin/jaxlake" fit --gpu h100 --devices "$n" --vary "$VARY" \
    --fraction 0.75 \
    --policies "$POLICIES" --traces "$FIT/traces-$n" --json "$FIT/fit-$n$TAG.json" \
    -- python -m maxtext.trainers.pre_train.train "$cfg" \
    model_name=qwen2.5-1.5b hardware=gpu attention=dot_product \
    dataset_type=synthetic per_device_batch_size={batch} max_target_length=1024 \
    steps=2 enable_checkpointing=false abort_on_nan_loss=false \
    run_name="fit$n" base_output_directory="$out" \
    > "$FIT/fit-$n$TAG.txt" 2> "$FIT/fit-$n$TAG.log"
  rc=$?
  end=$(date +%s)
  echo "== maxtext fit, $n device(s), $VARY, $POLICIES: exit $rc, $((end - start)) s"
  cat "$FIT/fit-$n$TAG.txt"
  [ "$rc" -eq 0 ] || tail -n 20 "$FIT/fit-$n$TAG.log"
done
