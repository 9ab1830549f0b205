#!/usr/bin/env bash
# A separate virtualenv for the vLLM API lane (`make test-vllm-api`): the real vLLM wheel on a CPU machine,
# enough of it to import and build its configuration objects (SamplingParams, EngineArgs,
# SpeculativeConfig). vLLM's own requirements pull CUDA packages and triton, so vLLM and xgrammar go in
# with --no-deps (xgrammar would pull triton) and the packages its imports need are listed here, pinned.
#   scripts/setup_vllm_api.sh        creates or reuses .venv-vllm-api
# Needs the package index once; a stamp skips the installs afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV_VLLM_API:-.venv-vllm-api}
PYTHON=${PYTHON:-python3}
VLLM_SPEC=vllm==0.33.0
# vLLM 0.33.0 asks for transformers >=5.16.1,<5.21 (specray's own range admits these)
DEPS=(
  torch==2.13.0 "transformers==5.20.2" tokenizers safetensors "pydantic>=2.7" pyyaml pyarrow
  pytest requests packaging numpy psutil regex cachetools filelock sentencepiece einops
  msgspec cbor2 pyzmq cloudpickle oss-harmony blake3 aiohttp openai pillow pybase64 uvloop py-cpuinfo
  prometheus_client fastapi partial-json-parser llguidance apache-tvm-ffi
)
stamp="$VENV/.installed-$( (cat "$0"; echo "$VLLM_SPEC") | sha256sum | cut -c1-16)"
[ -f "$stamp" ] && exit 0
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup-vllm-api: creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install -q --upgrade pip
echo "setup-vllm-api: installing $VLLM_SPEC (no deps) and the packages its imports need"
pip install -q torch==2.13.0  # first, pinned: the CPU build (see scripts/setup.sh)
pip install -q --no-deps "$VLLM_SPEC" xgrammar==0.2.8
pip install -q "${DEPS[@]}"
rm -f "$VENV"/.installed-*
touch "$stamp"
