"""benchmarks/specdec/gpu.py runs on a bare GPU machine (torch and transformers): its CPU smoke mode works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
GPU = [sys.executable, "-m", "benchmarks.specdec.gpu"]  # run from the repository root, as its docstring says


def test_gpu_benchmark_quick_mode_prints_the_ratios_and_imports_no_ray_mlflow_or_pydantic() -> None:
    """`--quick` (tests/integration/test_benchmarks_quick.py runs the other benchmarks'): tiny shapes, τ 0.6,
    on CPU where torch sees no GPU. Run as `python -m` runs a module, in a fresh interpreter that then names
    what it imported of Ray, MLflow and pydantic: nothing, also of what the run itself loads."""
    script = (
        "import runpy, sys\n"
        "sys.argv = ['-m', '--quick']\n"
        "try:\n"
        "    runpy.run_module('benchmarks.specdec.gpu', run_name='__main__', alter_sys=True)\n"
        "finally:\n"
        "    print('imported:' + ','.join(m for m in ('ray', 'mlflow', 'pydantic') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    *lines, imported = result.stdout.strip().splitlines()
    assert imported == "imported:", result.stdout
    assert lines[-1].startswith("τ=0.6: ours / HF = ") and "ours / limit = " in lines[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where there is no GPU")
def test_gpu_benchmark_without_cuda_says_so() -> None:
    result = subprocess.run([*GPU, "--device", "cuda"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "needs a CUDA GPU" in result.stderr and "--device cpu --small" in result.stderr
