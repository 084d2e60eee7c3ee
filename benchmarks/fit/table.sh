#!/usr/bin/env bash
# The bundled `jaxlake fit` tables of docs/results/fit.md: each row's search
# on an H100 and an H200 (traces reused between the two GPUs through
# --traces). Writes OUT/<row>-<gpu>.json; table.py turns them into the
# table.
#   benchmarks/fit/table.sh [OUT]      (default: ./jaxlake-fit)
# ENGINE=recorder (the default) records with jaxlake.Recorder, compiling
# without running (--compile-only); ENGINE=fake-gpu runs each value's two
# steps under `jaxlake run --fake-gpu` (XLA's real GPU client on the fake
# GPU). ROWS="small-none tiny-none" picks rows, GPUS="h100" the GPUs.
# REAL=1 runs instead the column of JAX's default run for real: `jaxlake fit
# --policies real:jax-default` (the program on XLA's own allocator as JAX
# sets it up by default, on a fake device of the GPU's size) for the rows
# that have a real_row line below, over a range around the models' answer;
# it writes OUT/real/<row>-<gpu>.json, which table.py adds as a column.
# Set XLA_FLAGS=--xla_gpu_autotune_level=0 for it (the fake GPU's
# autotuner times kernels that do not run).
set -euo pipefail
out=${1:-jaxlake-fit}
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python}
case $py in */*) py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" ;; esac
mkdir -p "$out"
out=$(cd "$out" && pwd)
# Run from the output folder: in the source tree `python -m jaxlake`
# would import the uncompiled package instead of the installed one.
cd "$out"
engine=${ENGINE:-recorder}
lm="$py $here/examples/train_lm.py"
lora="$py $here/examples/finetune_lora.py"
case $engine in
  recorder) common="--steps 2 --compile-only --no-progress" ;;
  fake-gpu) common="--steps 2 --no-progress" ;;
  *) echo "table.sh: ENGINE must be recorder or fake-gpu, not $engine" >&2
     exit 2 ;;
esac
rows=${ROWS:-}   # e.g. ROWS="1b-full 3b-full": only those rows
real=${REAL:-0}
row() {  # name "NAME=LO..HI [--step S]" command...
  local name=$1 vary=$2; shift 2
  if [ "$real" = 1 ]; then return; fi
  if [ -n "$rows" ] && [[ " $rows " != *" $name "* ]]; then return; fi
  for gpu in ${GPUS:-h100 h200}; do
    echo "== $name on $gpu ($engine)" >&2
    # (--fraction 0.75: every policy, the lake too, held to JAX's default
    # share, like with like; without it the lake's model gets the whole
    # device, as the lake does under `jaxlake run` with no fraction set)
    $py -m jaxlake fit --gpu "$gpu" --vary $vary --engine "$engine" \
      --fraction 0.75 \
      --traces "$out/traces" --json "$out/$name-$gpu.json" -- "$@" \
      > "$out/$name-$gpu.txt"
  done
}
row tiny-none batch=1024..1048576 $lm --preset tiny --dtype float32 --attention xla --batch {batch} $common
row small-none batch=256..65536 $lm --preset small --dtype float32 --attention xla --batch {batch} $common
row 1b-none batch=1..128 $lm --preset 1b --dtype bfloat16 --batch {batch} $common
row 1b-full batch=1..1024 $lm --preset 1b --dtype bfloat16 --remat full --batch {batch} $common
# the same at every batch size, where the powers of two are too coarse
row 1b-none-linear "batch=1..24 --step linear" $lm --preset 1b --dtype bfloat16 --batch {batch} $common
row 1b-dots batch=1..128 $lm --preset 1b --dtype bfloat16 --remat dots-saveable --batch {batch} $common
row 1b-buckets-eval batch=1..1024 $lm --preset 1b --dtype bfloat16 --remat full --seq-buckets 512,1024 --eval-every 1 --batch {batch} $common
row 1b-lora batch=1..128 $lora --preset 1b --dtype bfloat16 --batch {batch} $common
row 3b-full batch=1..128 $lm --preset 3b --dtype bfloat16 --remat full --batch {batch} $common
# The engines side by side on a small device (GPUS=1GiB), with both
# engines (table.py --compare); docs/results/fit.md also compares the
# tiny-none row at an H100's size.
row tiny-cmp batch=16..1024 $lm --preset tiny --dtype float32 --attention xla --batch {batch} $common
row small-cmp batch=1..256 $lm --preset small --dtype float32 --attention xla --batch {batch} $common
# JAX's default run for real (REAL=1), the program's two steps on the
# fake GPU, a run per value at the GPU's size: each GPU over the models'
# answer on that GPU and the next power of two (the linear row: the answer
# and the next value). The 1b and 3b rows pass --attention xla, the
# attention their models' traces were compiled with (the recorder compiles
# without a GPU, where --attention auto is xla; on the fake GPU auto is
# cuDNN's). Ordered by value: first the rows where BFC without
# preallocation fragments.
real_row() {  # name GPU "NAME=LO..HI [--step S]" command...
  local name=$1 gpu=$2 vary=$3; shift 3
  if [ "$real" != 1 ]; then return; fi
  if [ -n "$rows" ] && [[ " $rows " != *" $name "* ]]; then return; fi
  if [[ " ${GPUS:-h100 h200} " != *" $gpu "* ]]; then return; fi
  mkdir -p "$out/real"
  echo "== $name on $gpu (real:jax-default)" >&2
  $py -m jaxlake fit --gpu "$gpu" --vary $vary --engine fake-gpu \
    --policies real:jax-default --traces "$out/real/runs" \
    --json "$out/real/$name-$gpu.json" -- "$@" \
    > "$out/real/$name-$gpu.txt"
}
two="--steps 2 --no-progress"
b16="--preset 1b --dtype bfloat16 --attention xla"
for gpu in h100 h200; do
  real_row tiny-none $gpu batch=16384..65536 $lm --preset tiny --dtype float32 --attention xla --batch {batch} $two
  real_row small-none $gpu batch=1024..8192 $lm --preset small --dtype float32 --attention xla --batch {batch} $two
done
real_row 1b-none h100 batch=8..16 $lm $b16 --batch {batch} $two
real_row 1b-none h200 batch=16..32 $lm $b16 --batch {batch} $two
real_row 1b-none-linear h100 "batch=8..9 --step linear" $lm $b16 --batch {batch} $two
real_row 1b-none-linear h200 "batch=16..17 --step linear" $lm $b16 --batch {batch} $two
real_row 1b-buckets-eval h100 batch=128..256 $lm $b16 --remat full --seq-buckets 512,1024 --eval-every 1 --batch {batch} $two
real_row 1b-buckets-eval h200 batch=256..512 $lm $b16 --remat full --seq-buckets 512,1024 --eval-every 1 --batch {batch} $two
real_row 3b-full h100 batch=8..16 $lm --preset 3b --dtype bfloat16 --attention xla --remat full --batch {batch} $two
real_row 3b-full h200 batch=64..128 $lm --preset 3b --dtype bfloat16 --attention xla --remat full --batch {batch} $two
real_row 1b-full h100 batch=128..256 $lm $b16 --remat full --batch {batch} $two
real_row 1b-full h200 batch=256..512 $lm $b16 --remat full --batch {batch} $two
real_row 1b-dots h100 batch=16..32 $lm $b16 --remat dots-saveable --batch {batch} $two
real_row 1b-dots h200 batch=32..64 $lm $b16 --remat dots-saveable --batch {batch} $two
real_row 1b-lora h100 batch=8..16 $lora $b16 --batch {batch} $two
real_row 1b-lora h200 batch=16..32 $lora $b16 --batch {batch} $two
