"""A whole sweep under repeated, random faults finishes exactly once: the chaos supervisor's quick mode
(benchmarks/chaos/run.py; docs/RELIABILITY.md has the long run's figures).

The three tests share one fault-free run of the quick sweep (the reference). The supervisor must pass on
this repository, and must fail on a copy with a planted bug; the audit it ends with must find each kind of
damage a fault could leave (shown on copies of the reference's finished tree, which it first passes).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.stores import new_store
from tests.waiting import CLI_TIMEOUT_S

pytestmark = pytest.mark.integration
CHAOS = [sys.executable, "-m", "benchmarks.chaos.run"]  # from the repository root
# the planted bug: a re-run after the driver died opens a new MLflow parent run instead of resuming its own
# (the same sweep then has two parents, each with a child run per draft)
PLANTED = ("specray/tracking/client.py", "        if resume:\n", "        if False:  # planted bug\n")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from benchmarks.chaos.run import COMMON, QUICK, reference_run

    folder = tmp_path_factory.mktemp("chaos-reference")
    new_store(folder)  # the store the run's command names (chaos/run.py), made ahead (tests/stores.py)
    reference_run(folder, [*COMMON, *QUICK], REPO)
    return folder


def _chaos(out: Path, reference: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    command = [*CHAOS, "--quick", "--seed", "0", "--out", str(out)]
    new_store(out / "chaos")  # the chaos run's store (chaos/run.py), made ahead (tests/stores.py)
    result = subprocess.run(
        [*command, "--reference", str(reference), *options],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=2 * CLI_TIMEOUT_S,  # a hung run, not a slow one, reaches this
    )
    print(result.stdout[-6000:])  # the faults, the resumes and the verdict (pytest -s)
    assert (out / "chaos.json").exists(), result.stderr[-4000:]
    return result, json.loads((out / "chaos.json").read_text())


def test_a_sweep_under_random_faults_of_every_kind_finishes_as_the_fault_free_one(
    reference: Path, tmp_path: Path
) -> None:
    result, summary = _chaos(tmp_path, reference)
    assert result.returncode == 0 and summary["problems"] == [], summary["problems"]
    assert len(summary["struck"]) >= 5, summary
    assert result.stdout.strip().splitlines()[-1].startswith("chaos quick seed 0: PASSED")


def test_a_planted_bug_makes_the_chaos_run_fail(reference: Path, tmp_path: Path) -> None:
    """The runs use a copy of specray whose resumed sweep opens a second MLflow parent run; one fault (the
    driver killed mid-distillation, after its parent run was opened) is enough for the audit to see two
    parents. A driver kill rather than a Ray one: the supervisor re-runs the command at once, with no wait for
    a driver to notice its cluster died and no cluster to start again."""
    source = tmp_path / "source"
    shutil.copytree(REPO / "specray", source / "specray", ignore=shutil.ignore_patterns("__pycache__"))
    path, good, bad = PLANTED
    text = (source / path).read_text()
    assert text.count(good) == 1, f"{path} changed: plant the bug anew"
    (source / path).write_text(text.replace(good, bad))
    options = ("--only", "driver", "--phase", "distill", "--source", str(source))
    result, summary = _chaos(tmp_path / "out", reference, *options)
    assert [(s["kind"], s["phase"]) for s in summary["struck"]] == [("driver", "distill")], summary
    assert result.returncode == 1
    assert any(p.startswith("MLflow: 2 parent runs") for p in summary["problems"]), summary["problems"]


def test_the_audit_finds_what_a_fault_could_leave_behind(reference: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from benchmarks.chaos.audit import Tree, audit

    copy = tmp_path / "copy"
    shutil.copytree(reference, copy)
    assert audit(Tree(reference), Tree(copy)) == []

    cells = copy / "out" / "smoke" / "cells"
    (cells / ".0123.json.abcd.tmp").write_text("{")  # a write cut short by a kill
    weights = next((copy / "out" / "smoke" / "drafts").glob("*/model.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8] + bytes(8))  # changed after its publication
    client = MlflowClient(Tree(copy).uri)
    experiment = client.get_experiment_by_name("smoke").experiment_id
    child = next(r for r in client.search_runs([experiment]) if r.data.tags.get("draft") == "non-distill")
    key = next(k for k in child.data.metrics if k.startswith("acceptance_rate/"))
    client.log_metric(child.info.run_id, key, child.data.metrics[key])  # logged again by a resumed run
    problems = audit(Tree(reference), Tree(copy))
    assert any(p.startswith(f"{cells / '.0123.json.abcd.tmp'}: left behind") for p in problems), problems
    assert any(p.startswith(f"draft {weights.parent.name}: weights differ") for p in problems), problems
    assert any(f"{key} logged 2 times at 1 steps" in p for p in problems), problems

    client.create_run(experiment, tags={"specray.role": "sweep"})  # a second parent
    assert "MLflow: 2 parent runs" in " ".join(audit(Tree(reference), Tree(copy)))
