"""Every benchmark's quick mode runs against the library as it is now (`--quick`, benchmarks/quick.py).

A benchmark is a script nobody runs until someone needs its figure; an API change that breaks one then
shows months later. Here each runs as the README says (`python benchmarks/<name>.py --quick`, a fresh
process) on a micro zoo that the first one builds into a cache the others share. The test checks that it
ran and printed its summary line, never the figures: timings on a CI machine mean nothing.
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
# script -> a line its quick run must print (its last summary line, figures left out)
QUICK = {
    "bf16.py": r"^bf16 / fp32 speed: forward [\d.]+x, sampling [\d.]+x, training [\d.]+x",
    "batch.py": r"^modelled / measured: worst \|ratio - 1\| = [\d.]+ over \d+ points",
    "convergence.py": r"^wall [\d.]+ s, CPU [\d.]+ s",
    "drafts.py": r"^\| `\{fresh: \{hidden_size: 32, ",
    "distill.py": r"^online/offline cost ratio: [\d.]+x per trained token",
    "mlflow_lineage.py": r"^sqlite: old +[\d.]+ s, new +[\d.]+ s",
    # without TRL (the CI lane: `pip install -e '.[peers]'` is opt-in) it prints how to install it and exits 0
    "peers.py": r"^(teacher engine / model\.generate tokens/s: [\d.]+ at|skipped: TRL is not installed)",
    "probe.py": r"^the probe's share of the draft: [\d.]+ of its wall time",
    "scale.py": r"^kd step peak memory chunked / unchunked: [\d.]+$",
    "specdec.py": r"^τ=1.0: ours / HF = [\d.]+ +ours / limit = ",
    "stages.py": r"^distillation steps at [\d.]+ \(offline\) and [\d.]+ \(online\) of the fp32 matmul peak",
    "teacher_pass.py": r"^ +states \+ prompt caches: +[\d.]+ CPU s",
    "teacher_pool.py": r"^2 replicas / 1 replica \(1 thread each\): [\d.]+x",
    "train_overhead.py": r"^ +ray_train: +[\d.]+ s wall",
    "train_runs.py": r"^ +one run: +[\d.]+ s wall",
    "tune_exhaustive.py": r"^Tune vs exhaustive: regret [\d.]+% \(mean of \d+ searches",
}
ELSEWHERE = {
    "chaos.py": "its --quick runs in tests/integration/test_chaos.py (a sweep under faults, then its audit)",
    "chaos_audit.py": "a library: chaos.py's audit",
    "chaos_cluster.py": "a library: chaos.py's two-node Ray",
    "chaos_schedule.py": "a library: chaos.py's fault schedule (tests/unit/test_chaos_schedule.py)",
    "chaos_supervisor.py": "a library: chaos.py's loop of faults and re-runs",
    "gpu.py": "its --quick runs in tests/unit/test_benchmark_gpu.py (no Ray, no pydantic: the unit lane)",
    "harness.py": "a library: specdec.py's and gpu.py's quick runs go through it",
    "peers_eval.py": "a library: peers.py's quick run goes through it",
    "peers_trl.py": "a library: peers.py's quick run goes through it (where TRL is installed)",
    "quick.py": "the quick mode itself",
}


def test_every_benchmark_has_its_quick_mode_run() -> None:
    scripts = {path.name for path in BENCHMARKS.glob("*.py")}
    assert scripts == set(QUICK) | set(ELSEWHERE), "a new benchmark needs a --quick mode run here"


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


@pytest.mark.parametrize("script", sorted(QUICK))
def test_the_quick_mode_runs_and_prints_its_summary(script: str, env: dict[str, str], tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick"],
        cwd=tmp_path,  # what a benchmark writes in its working folder (an MLflow store) stays here
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"{script} --quick failed:\n{result.stderr[-4000:]}"
    assert re.search(QUICK[script], result.stdout, re.MULTILINE), result.stdout[-4000:]
