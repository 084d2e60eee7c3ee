#!/usr/bin/env bash
# The project's own examples with their default flags (attention auto, so
# cuDNN fused attention; XLA's default flags).
#   VENV=... benchmarks/compat/examples.sh
source "$(dirname "$0")/_env.sh"
VENV="${VENV:-$SRC/venv311}"
cd "$REPO/examples"
run_row train_lm-tiny 1 "$VENV/bin/python" train_lm.py --preset tiny --no-progress
run_row train_sharded 2 "$VENV/bin/python" train_sharded.py --no-progress
run_row finetune_lora 1 "$VENV/bin/python" finetune_lora.py --no-progress
