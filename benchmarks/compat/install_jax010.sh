#!/usr/bin/env bash
# Makes the venv for the jax 0.10.2 rows (Python 3.11): jax[cuda12] with
# NVIDIA's wheels (the usual install; the fake's loader guard keeps them
# out), Flax, Optax, Equinox, Keras 3 and keras-hub, matplotlib for Flax's
# toy examples, and jaxlake built from this checkout.
#   benchmarks/compat/install_jax010.sh [VENV]   (default ~/.cache/jaxlake-compat/venv311)
source "$(dirname "$0")/_env.sh"
set -e
VENV="${1:-$SRC/venv311}"
python3.11 -m venv "$VENV"
"$VENV/bin/pip" install -q scikit-build-core nanobind "jax[cuda12]==0.10.2" \
  flax optax equinox keras keras-hub matplotlib
"$VENV/bin/pip" install -q --no-build-isolation --no-deps "$REPO"
"$VENV/bin/pip" list 2>/dev/null | grep -iE "^(jax|jaxlib|flax|optax|equinox|keras|keras-hub|jaxlake) "
