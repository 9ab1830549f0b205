"""Import boundaries: specray.ops is pure torch (no ray, mlflow, vllm or transformers), and the GPU suite runs
where only torch, transformers and the scientific stack are installed (no ray, mlflow or pydantic)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

FORBIDDEN = ("ray", "mlflow", "vllm", "transformers")
GPU_FORBIDDEN = ("ray", "mlflow", "pydantic", "pyarrow", "rich", "specray.config")


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("specray.ops", FORBIDDEN),
        # checked before any heavy import (specray/named_files.py): it must not be one
        ("specray.named_files", ("torch", "transformers", "datasets", "ray", "mlflow")),
        # what every sweep's eval actor imports: none of the report's stack (its start is in every sweep)
        ("specray.specdec.workers", ("scipy.stats", "mlflow", "matplotlib", "pandas")),
        # what every `specray run` imports: the file loaders' `datasets` and the DistillSpec section's
        # scipy.stats load where they are used (about 0.9 CPU s per driver otherwise)
        ("specray.cli.sweep, specray.sweep.run", ("datasets", "scipy.stats")),
        # what Ray Train's controller unpickles with every run (the worker's entry point and its config):
        # the controller trains nothing, and transformers is ~0.7 CPU s of its start
        ("specray.distill.train_worker", ("transformers",)),
    ],
)
def test_light_modules_import_no_heavy_frameworks(module: str, forbidden: tuple[str, ...]) -> None:
    # a fresh interpreter, so modules imported by other tests in this process cannot mask a leak
    script = (
        f"import sys, {module}\n"
        f"leaked = [m for m in {forbidden!r} if m in sys.modules]\n"
        "print(','.join(leaked))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"{module} imported: {result.stdout.strip()}"


def test_the_gpu_suite_imports_no_ray_mlflow_or_pydantic() -> None:
    """tests/gpu/ runs on a bare GPU machine (torch, transformers, numpy, scipy, pytest): its modules, the
    conftest files pytest loads for it and every specray module they reach must not need the rest."""
    gpu = sorted(path.stem for path in (REPO / "tests" / "gpu").glob("*.py") if path.stem != "__init__")
    modules = ["tests.conftest", *(f"tests.gpu.{name}" for name in gpu)]
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"leaked = [m for m in {GPU_FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(leaked))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert len(modules) >= 4 and result.stdout.strip() == "", (
        f"the GPU suite imported: {result.stdout.strip()}"
    )


def test_the_driver_imports_no_model_code() -> None:
    """The sweep's driver plans, tokenizes, starts the stages and writes the report; the models load in Ray's
    actors and Train workers. transformers' model code (PreTrainedModel and the modules it pulls in: torch's
    compiler, quantizers, loss functions) costs seconds of imports per process, so a `specray run` must not
    import it — nor a Train controller, which loads the distillation module to read the run's settings."""
    script = (
        "import sys\n"
        "import specray.cli.sweep, specray.sweep.run, specray.sweep.stages, specray.distill.ray_train\n"
        "print('transformers.modeling_utils' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", "a driver module imports transformers' model code at the top"
