#!/usr/bin/env bash
# Equinox: a typical training script (equinox_cnn.py), 1 fake device.
#   VENV=... benchmarks/compat/equinox.sh
source "$(dirname "$0")/_env.sh"
VENV="${VENV:-$SRC/venv311}"
run_row equinox-cnn 1 "$VENV/bin/python" "$HERE/equinox_cnn.py" --steps 20 --batch 64
