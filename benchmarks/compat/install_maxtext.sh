#!/usr/bin/env bash
# Makes the venv for the MaxText rows (Python 3.12, as maxtext 0.2.5
# requires): maxtext's `cuda12` extra (jax 0.12 with NVIDIA's wheels) less
# transformer-engine-jax, an sdist that compiles against the CUDA toolkit's
# headers (cuda_runtime_api.h) and so does not build without one; MaxText's
# default attention on a GPU does not need it. Then maxtext itself,
# equinox and keras-hub, and jaxlake built from this checkout.
#   benchmarks/compat/install_maxtext.sh [VENV]   (default ~/.cache/jaxlake-compat/venv312)
source "$(dirname "$0")/_env.sh"
set -e
VENV="${1:-$SRC/venv312}"
PY="${PYTHON312:-python3.12}"   # PYTHON312=/path/to/python3.12 where it is not on PATH
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q scikit-build-core nanobind
"$VENV/bin/pip" download -q maxtext==0.2.5 --no-deps -d "$SRC"
"$VENV/bin/python" - "$SRC/maxtext-0.2.5-py3-none-any.whl" > "$SRC/maxtext-req.txt" <<'PY'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith("METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:") or "extra == 'cuda12'" not in line:
            continue
        req = line.split(":", 1)[1].strip()
        req = req.replace(" and extra == 'cuda12'", "")
        req = req.replace("; extra == 'cuda12'", "")
        if not req.startswith("transformer-engine"):
            print(req)
PY
"$VENV/bin/pip" install -q -r "$SRC/maxtext-req.txt"
"$VENV/bin/pip" install -q --no-deps maxtext==0.2.5
# The Equinox and Keras rows at jax 0.12 run in this venv too; keras-hub
# brings TensorFlow 2.21 (through tensorflow-text); the extra's
# requirements still hold (h5py goes from 3.16 to 3.14: it asks >=3.14).
"$VENV/bin/pip" install -q equinox keras-hub
"$VENV/bin/pip" install -q --no-build-isolation --no-deps "$REPO"
"$VENV/bin/pip" list 2>/dev/null | grep -iE "^(jax|jaxlib|flax|maxtext|equinox|keras|keras-hub|jaxlake) "
