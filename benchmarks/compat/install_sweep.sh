#!/usr/bin/env bash
# The venv of sweep.sh's diffrax row: $SRC/venv-diffrax, over VENV's
# packages (a .pth file adds VENV's site-packages as a site directory, so
# that its own .pth files, jaxlake's start-up hook among them, run), with
# diffrax and its dependencies (equinox, lineax, optimistix, jaxtyping)
# installed into it alone; VENV itself is not touched.
#   VENV=... benchmarks/compat/install_sweep.sh
source "$(dirname "$0")/_env.sh"
VENV="${VENV:-$REPO/.venv}"
DIFFRAX_VENV="${DIFFRAX_VENV:-$SRC/venv-diffrax}"
base=$("$VENV/bin/python" -c "import site; print(site.getsitepackages()[0])")
python3 -m venv "$DIFFRAX_VENV"
own=$("$DIFFRAX_VENV/bin/python" -c "import site; print(site.getsitepackages()[0])")
echo "import site; site.addsitedir('$base')" > "$own/sweep-base.pth"
"$DIFFRAX_VENV/bin/pip" install -q diffrax
"$DIFFRAX_VENV/bin/python" -c "import diffrax, jax; print('diffrax', diffrax.__version__, 'jax', jax.__version__)"
