#!/usr/bin/env bash
# CI, the lowest end: the default Python (3.11) with the lowest versions the
# extras admit, as `uv pip install --resolution lowest-direct` picks them
# (jax, jaxlib and the CUDA 12 plugin 0.10.0, flax 0.12.2, optax 0.2.6,
# orbax-checkpoint 0.11.17, rich 13.0.0, matplotlib 3.9.0, tqdm 4.60.0; the
# list it resolved is printed). The test tools come at their newest: the
# lowest pytest or mypy ever released says nothing about jaxlake. Then the
# tests that depend on those versions: the recorder, the XLA integration
# and the shim's symbol list against the plugin, XLA's client on the fake
# GPU (a jit, the tiny trainer), and the examples that use the most of
# flax, optax and orbax (LoRA, a checkpoint resumed, FSDP). The README's test
# command runs everything on the default versions (jax 0.10.2), and
# .ci/newest.sh the newest end. JAXLAKE_LOWEST_PYTHON names another interpreter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${JAXLAKE_LOWEST_PYTHON:-python3}"
VENV=.venv-lowest
start=$SECONDS
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q uv
uv=("$VENV/bin/uv" pip)
"${uv[@]}" compile -q --python "$VENV/bin/python" --resolution lowest-direct \
  pyproject.toml --extra examples --extra record -o "$VENV/lowest.txt"
"${uv[@]}" install -q --python "$VENV/bin/python" -r "$VENV/lowest.txt" \
  pytest pytest-xdist hypothesis cmake ninja
# jaxlake itself, with exactly those versions (--no-deps: nothing moves).
"${uv[@]}" install -q --python "$VENV/bin/python" --no-deps .
echo "== lowest: installed in $((SECONDS - start)) s"
start=$SECONDS
"$VENV/bin/python" --version
grep -iE '^(jax|jaxlib|jax-cuda12-(plugin|pjrt)|flax|optax|orbax-checkpoint|rich|matplotlib)==' \
  "$VENV/lowest.txt" | tr '\n' ' '
echo
# `pip check`'s view: the lowest set is consistent.
"$VENV/bin/python" -m pip check
"$VENV/bin/pytest" -q -p no:cacheprovider tests/test_recorder.py \
  tests/test_xla.py tests/test_xla_fake_driver.py tests/test_xla_symbols.py \
  tests/test_fake_gpu.py::test_devices_round_trip_and_jit_output_from_the_lake \
  tests/test_fake_gpu.py::test_train_lm_tiny_every_pool_buffer_served \
  tests/test_examples.py::test_lora_finetune \
  tests/test_examples.py::test_resume_reproduces_the_loss \
  "tests/test_examples.py::test_sharded_on_8_cpu_devices[fsdp]"
echo "== lowest: tests in $((SECONDS - start)) s"
