"""Every benchmark's quick mode runs against the library as it is now (`--quick`, benchmarks/quick.py).

A benchmark is a script nobody runs until someone needs its figure; an API change that breaks one then
shows months later. Here each runs as the README says (`python -m benchmarks.<group>.<name> --quick`, a
fresh process) on a micro zoo that the first one builds into a cache the others share. The test checks that
it ran and printed its summary line, never the figures: timings on a CI machine mean nothing. Every module
under benchmarks/ is found and must be named below, with its summary line or where else it runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration

BENCHMARKS = REPO / "benchmarks"
# module (under benchmarks.) -> a line its quick run must print (its last summary line, figures left out)
QUICK = {
    "compute.bf16": r"^bf16 / fp32 speed: forward [\d.]+x, sampling [\d.]+x, training [\d.]+x",
    "specdec.batch": r"^modelled / measured: worst \|ratio - 1\| = [\d.]+ over \d+ points",
    "distill.convergence": r"^wall [\d.]+ s, CPU [\d.]+ s",
    "specdec.drafts": r"^\| `\{fresh: \{hidden_size: 32, ",
    "distill.throughput": r"^online/offline cost ratio: [\d.]+x per trained token",
    "sweep.mlflow_lineage": r"^sqlite: old +[\d.]+ s, new +[\d.]+ s",
    # without TRL (the CI lane: `pip install -e '.[peers]'` is opt-in) it prints how to install it and exits 0
    "peers.compare": r"^(teacher engine / model\.generate tokens/s: [\d.]+ at|skipped: TRL is not installed)",
    "compute.scale": r"^kd step peak memory chunked / unchunked: [\d.]+$",
    "specdec.decoder": r"^τ=1.0: ours / HF = [\d.]+ +ours / limit = ",
    "compute.stages": r"^distillation steps at [\d.]+ \(offline\) and [\d.]+ \(online\) of the fp32 matmul",
    "teacher.online_pass": r"^ +states \+ prompt caches: +[\d.]+ CPU s",
    "teacher.pool": r"^2 replicas / 1 replica \(1 thread each\): [\d.]+x",
    "distill.train_overhead": r"^ +ray_train: +[\d.]+ s wall",
    "distill.train_runs": r"^ +one run: +[\d.]+ s wall",
    "tune.exhaustive": r"^Tune vs exhaustive: regret [\d.]+% \(mean of \d+ searches",
}
ELSEWHERE = {
    "chaos.run": "its --quick runs in tests/integration/test_chaos.py (a sweep under faults, then its audit)",
    "chaos.audit": "a library: chaos.run's audit",
    "chaos.targets": "a library: chaos.run's targets on the loopback cluster (specray.cluster.loopback)",
    "chaos.schedule": "a library: chaos.run's fault schedule (tests/unit/test_chaos_schedule.py)",
    "chaos.supervisor": "a library: chaos.run's loop of faults and re-runs",
    "specdec.gpu": "its --quick runs in tests/unit/test_benchmark_gpu.py (no Ray or pydantic: the unit lane)",
    "specdec.harness": "a library: specdec.decoder's and specdec.gpu's quick runs go through it",
    "peers.evaluation": "a library: peers.compare's quick run goes through it",
    "peers.trl_side": "a library: peers.compare's quick run goes through it (where TRL is installed)",
    "peers.trl_checks": "a library: peers.trl_side's run-time checks (where TRL is installed)",
    "peers.jobs": "a library: peers.compare's measurements, one per fresh process",
    "quick": "the quick mode itself",
}


def benchmark_modules() -> set[str]:
    """Every module under benchmarks/ by dotted name below `benchmarks.` (packages' __init__ left out)."""
    modules = (p.relative_to(BENCHMARKS).with_suffix("") for p in BENCHMARKS.rglob("*.py"))
    return {".".join(m.parts) for m in modules if m.name != "__init__"}


def test_every_benchmark_has_its_quick_mode_run() -> None:
    assert benchmark_modules() == set(QUICK) | set(ELSEWHERE), "a new benchmark needs a --quick mode run here"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The repository on the path, one cache for every run (the micro zoo is built once), no telemetry."""
    return os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "SPECRAY_CACHE": str(tmp_path_factory.mktemp("benchmarks-cache")),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "HF_HUB_OFFLINE": "1",
    }


@pytest.mark.parametrize("module", sorted(QUICK))
def test_the_quick_mode_runs_and_prints_its_summary(module: str, env: dict[str, str], tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--quick"],
        cwd=tmp_path,  # what a benchmark writes in its working folder (an MLflow store) stays here
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"{module} --quick failed:\n{result.stderr[-4000:]}"
    assert re.search(QUICK[module], result.stdout, re.MULTILINE), result.stdout[-4000:]
