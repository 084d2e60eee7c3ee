#!/usr/bin/env bash
# Keras 3 (JAX backend) and keras-hub: GPT-2 from a config, model.fit on
# synthetic tokens (keras_gpt2.py), 1 fake device.
#   VENV=... benchmarks/compat/keras.sh
source "$(dirname "$0")/_env.sh"
VENV="${VENV:-$SRC/venv311}"
KERAS_BACKEND=jax run_row keras-gpt2 1 "$VENV/bin/python" "$HERE/keras_gpt2.py" \
  --steps 4 --batch 4 --seq 128
