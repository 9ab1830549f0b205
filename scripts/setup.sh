#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv and install specray into it, editable.
#   scripts/setup.sh          runtime only
#   scripts/setup.sh test     with the test tools
# torch goes in first, pinned: on CPU machines torch==2.13.0 resolves to a local CPU build, and with it
# installed the package's own torch range adds nothing (an unpinned torch would pull GBs of CUDA wheels).
# On a GPU machine the same pin installs the CUDA build from PyPI; set TORCH_SPEC to choose another.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
extras=${1:-}

stamp="$VENV/.installed-$( (cat pyproject.toml; echo "$extras $TORCH_SPEC") | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: installing $TORCH_SPEC"
  pip install -q "$TORCH_SPEC"
fi
echo "setup: installing specray${extras:+[$extras]} and its dependencies"
pip install -q -e ".${extras:+[$extras]}"
rm -f "$VENV"/.installed-*
touch "$stamp"
