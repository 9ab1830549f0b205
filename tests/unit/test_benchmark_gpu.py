"""benchmarks/gpu.py runs on a bare GPU machine (torch + transformers only) and its CPU smoke mode works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

GPU_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"


def test_gpu_benchmark_imports_no_ray_mlflow_or_pydantic() -> None:
    # a fresh interpreter: modules other tests imported cannot mask a leak
    script = (
        "import runpy, sys\n"
        f"runpy.run_path({str(GPU_SCRIPT)!r}, run_name='not_main')\n"
        "print(','.join(m for m in ('ray', 'mlflow', 'pydantic') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1:] in ([], [""]), result.stdout


def test_gpu_benchmark_quick_mode_prints_the_ratios() -> None:
    """`--quick` (tests/integration/test_benchmarks_quick.py runs the other benchmarks'): tiny shapes, τ 0.6,
    on CPU where torch sees no GPU."""
    result = subprocess.run(
        [sys.executable, str(GPU_SCRIPT), "--quick"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("τ=0.6: ours / HF = ") and "ours / limit = " in last


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where there is no GPU")
def test_gpu_benchmark_without_cuda_says_so() -> None:
    result = subprocess.run(
        [sys.executable, str(GPU_SCRIPT), "--device", "cuda"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1
    assert "needs a CUDA GPU" in result.stderr and "--device cpu --small" in result.stderr
