#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv and install specray into it, editable. What it installs:
#   scripts/setup.sh          torch (TORCH_SPEC), then specray and its dependencies, into $VENV (.venv)
#   scripts/setup.sh test     the same with the test tools (pytest, ruff, mypy, mkdocs, ...), and, run as root
#                             on a machine with apt-get, Debian's chromium for the MLflow UI test
# torch goes in first, pinned, with pip (it reads the machine's pip configuration: indexes, local wheels), so
# the package's own torch range adds nothing. Which build the pin resolves to is the package index's choice
# (PyPI's Linux wheels are CUDA builds, GBs of them): TORCH_INDEX_URL picks PyTorch's own index for a build,
# e.g. https://download.pytorch.org/whl/cpu (docs/troubleshooting.md). The rest goes in with uv, which
# resolves and installs the ~150 other packages in parallel: about a minute less than pip on a fresh machine
# (SPECRAY_SETUP_INSTALLER=pip keeps to pip, e.g. where only a pip-configured mirror is reachable).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
INSTALLER=${SPECRAY_SETUP_INSTALLER:-uv}
extras=${1:-}

# --- test extra only: Debian's chromium, for the MLflow UI integration test (tests/integration/test_mlflow_ui.py).
# Idempotent (skipped once chromium is on PATH) and best effort: without apt-get or root the test skips with
# its reason. It runs before the stamp check below because it is a system package, not part of the venv.
if [ "$extras" = test ] && ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing chromium (Debian's package, as root via apt-get) for the MLflow UI test"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
      || echo "setup: warning: could not install chromium; the MLflow UI test will skip" >&2
  else
    echo "setup: warning: chromium not found and apt-get (as root) unavailable; the MLflow UI test will skip" >&2
  fi
fi
# --- end of the chromium step

# specray's own modules (and the tests' and benchmarks' helpers): an editable install leaves them as sources,
# and where PYTHONDONTWRITEBYTECODE is set no process caches their bytecode, so each CLI call, Ray worker and
# actor would compile the ~150 modules it imports again (about 0.6 s a process). Compiled at every setup:
# only what changed since the last one is compiled again, a fraction of a second.
compile_own() { "$VENV/bin/python" -m compileall -q specray tests benchmarks; }

stamp="$VENV/.installed-$( (cat pyproject.toml; echo "$extras $TORCH_SPEC $TORCH_INDEX_URL") | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  compile_own
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: installing $TORCH_SPEC${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL} (TORCH_SPEC, TORCH_INDEX_URL choose the build)"
  pip install -q "$TORCH_SPEC" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
if [ "$INSTALLER" = uv ] && ! "$VENV/bin/python" -m uv --version >/dev/null 2>&1; then
  pip install -q uv || { echo "setup: warning: could not install uv; installing with pip" >&2; INSTALLER=pip; }
fi
echo "setup: installing specray${extras:+[$extras]} and its dependencies (with $INSTALLER)"
case "$INSTALLER" in
  # torch is installed already, so uv keeps it (it does not read pip's configuration, so it must not pick one).
  # --compile-bytecode: uv writes no .pyc files by default (pip does), and where PYTHONDONTWRITEBYTECODE is
  # set Python never writes them either: every process — each CLI call, each Ray worker and actor — would
  # compile Ray, MLflow, transformers and pandas from source at import (`import ray.train.torch`: 6.3 s
  # against 3.4 s compiled). Compiling them once here takes about half a minute.
  uv) "$VENV/bin/python" -m uv pip install -q --compile-bytecode --python "$VENV/bin/python" -e ".${extras:+[$extras]}" ;;
  pip) pip install -q -e ".${extras:+[$extras]}" ;;
  *) echo "setup: SPECRAY_SETUP_INSTALLER must be uv or pip, not '$INSTALLER'" >&2; exit 2 ;;
esac
compile_own
rm -f "$VENV"/.installed-*
touch "$stamp"
