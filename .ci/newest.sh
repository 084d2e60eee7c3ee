#!/usr/bin/env bash
# CI, the newest end: Python 3.12 (or 3.13) with jax 0.12 and the newest
# flax, optax, orbax-checkpoint and CUDA plugin pip finds, installed first
# as a user would have them; then the test extra beside them (which must
# change none of them) and the integration, shim, recorder, example and
# API tests (of the examples, those that depend on jax's version; see
# below). JAXLAKE_NEWEST_PYTHON names another interpreter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${JAXLAKE_NEWEST_PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.12 python3.13 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 \
      "$HOME"/.pyenv/versions/3.13*/bin/python3.13; do
    # A pyenv shim is on PATH even when that version is not selected: try it.
    if "$candidate" -c "import sys" >/dev/null 2>&1; then PY="$candidate"; break; fi
  done
fi
if [ -z "$PY" ]; then
  echo "newest: no Python 3.12 or 3.13 found (set JAXLAKE_NEWEST_PYTHON)" >&2
  exit 1
fi
VENV=.venv-newest
start=$SECONDS
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q "jax>=0.12,<0.13" flax optax orbax-checkpoint
"$VENV/bin/pip" freeze | sort > "$VENV/before.txt"
"$VENV/bin/pip" install -q ".[test]"
"$VENV/bin/pip" freeze | sort > "$VENV/after.txt"
# Installing the extras beside the user's packages changes none of them.
changed=$(comm -23 "$VENV/before.txt" "$VENV/after.txt")
if [ -n "$changed" ]; then
  echo "newest: the test extra changed installed packages:" >&2
  echo "$changed" >&2
  exit 1
fi
echo "== newest: installed in $((SECONDS - start)) s"
start=$SECONDS
"$VENV/bin/python" --version
grep -iE '^(jax|jaxlib|jax-cuda1[23]-(plugin|pjrt)|flax|optax|orbax-checkpoint)==' \
  "$VENV/after.txt"
# Whole: the XLA integration, the shim's symbols against the plugin, the
# recorder, the public API and XLA's client on the fake GPU. Of the example
# tests, those that run each example through the APIs that move between jax
# versions (flax NNX, optax, orbax checkpoints, remat policies, sharding,
# jax.distributed, the recorder's compile): the argument-error, --help and
# other-layout tests run the same code paths on every version, and the
# default pass runs them.
"$VENV/bin/pytest" -q tests/test_xla.py tests/test_xla_fake_driver.py \
  tests/test_xla_symbols.py tests/test_recorder.py \
  tests/test_api.py tests/test_fake_gpu.py tests/test_fake_gpu_linalg.py \
  tests/test_fake_gpu_blas.py tests/test_fake_gpu_names.py \
  tests/test_fake_gpu_programs.py tests/test_fake_gpu_libs.py \
  tests/test_examples.py::test_examples_start_quietly \
  tests/test_examples.py::test_train_lm_loss_falls \
  tests/test_examples.py::test_resume_reproduces_the_loss \
  tests/test_examples.py::test_compile_only_shows_compiles_and_no_loss \
  tests/test_examples.py::test_trace_is_what_replay_reads \
  tests/test_examples.py::test_unrolled_remat_accumulation_buckets_eval \
  tests/test_examples.py::test_lora_finetune \
  "tests/test_examples.py::test_sharded_on_8_cpu_devices[fsdp]" \
  tests/test_examples.py::test_two_processes
echo "== newest: tests in $((SECONDS - start)) s"
