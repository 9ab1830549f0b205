"""benchmarks/specdec/gpu.py runs on a bare GPU machine (torch and transformers): its CPU smoke mode works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
GPU = [sys.executable, "-m", "benchmarks.specdec.gpu"]  # run from the repository root, as its docstring says


def test_gpu_benchmark_imports_no_ray_mlflow_or_pydantic() -> None:
    # a fresh interpreter: modules other tests imported cannot mask a leak
    script = (
        "import sys\n"
        "import benchmarks.specdec.gpu\n"
        "print(','.join(m for m in ('ray', 'mlflow', 'pydantic') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip().splitlines()[-1:] in ([], [""]), result.stdout


def test_gpu_benchmark_quick_mode_prints_the_ratios() -> None:
    """`--quick` (tests/integration/test_benchmarks_quick.py runs the other benchmarks'): tiny shapes, τ 0.6,
    on CPU where torch sees no GPU."""
    result = subprocess.run([*GPU, "--quick"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("τ=0.6: ours / HF = ") and "ours / limit = " in last


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where there is no GPU")
def test_gpu_benchmark_without_cuda_says_so() -> None:
    result = subprocess.run([*GPU, "--device", "cuda"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "needs a CUDA GPU" in result.stderr and "--device cpu --small" in result.stderr
