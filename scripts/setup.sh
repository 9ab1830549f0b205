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

# --- test extra only: Debian's chromium, for the MLflow UI integration test (tests/integration/test_mlflow_ui.py).
# Idempotent (skipped once chromium is on PATH) and best effort: without apt-get or root the test skips with
# its reason. It runs before the stamp check below because it is a system package, not part of the venv.
if [ "$extras" = test ] && ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing chromium (apt) for the MLflow UI test"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
      || echo "setup: warning: could not install chromium; the MLflow UI test will skip" >&2
  else
    echo "setup: warning: chromium not found and apt-get (as root) unavailable; the MLflow UI test will skip" >&2
  fi
fi
# --- end of the chromium step

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
