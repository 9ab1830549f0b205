"""Changing a setting recomputes exactly what it changes, through the real CLI on the smoke sweep (a copy of
the session's finished one): a new γ re-evaluates every cell and retrains nothing; a new divergence retrains
only the online drafts; the same command again computes nothing; two training replicates add one draft per
draft; a grid of divergences × data sources trains one online draft per pair — and every MLflow parent run
holds the metrics of its own settings.

The same runs check collisions and damaged files: a second `specray run` on the folder while one holds it is
refused before any work, naming the holder; a holder killed with SIGKILL leaves no lock behind; then a draft
whose weights were cut short is trained again (the damaged folder kept aside) and a cell record cut
mid-write is computed again, each with its reason."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from specray.locks import FOLDER_LOCK
from specray.report import distillspec, distillspec_prompts
from specray.tracking.names import PARENT, ROLE
from tests.integration.conftest import FinishedSweep
from tests.sweeps import (
    CELLS_PER_DRAFT,
    COARSE_TIMING,
    finished_drafts,
    run_cli,
    smoke_command,
)
from tests.waiting import CLI_TIMEOUT_S, wait_until

pytestmark = pytest.mark.integration
DRAFTS = 5  # the un-distilled draft, offline and online at τ_kd 0 and 1
CELLS = CELLS_PER_DRAFT * DRAFTS


def _start(command: list[str], cwd: Path) -> subprocess.Popen:
    # its own session, so the whole tree (the driver and the Ray it starts) can be killed at once
    return subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _held_by(lock: Path, process: subprocess.Popen) -> bool:
    """Whether `process` holds the folder by now (or has ended, which the caller then sees)."""
    if process.poll() is not None:
        return True
    try:
        return json.loads(lock.read_text())["pid"] == process.pid
    except (OSError, ValueError, KeyError):
        return False


def _plan(stdout: str) -> dict[str, str]:
    """The plan's lines by stage: `{"drafts": "4 reused, 0 to compute", ...}`."""
    lines = stdout.split("what will be computed, and why):", 1)[1].splitlines()[1:5]
    return {line[2:17].strip(): line[17:].strip() for line in lines}  # "  <stage:15> <counts>"


def _counts(line: str) -> tuple[int, int]:
    reused, todo = re.match(r"(\d+) reused, (\d+) to compute", line).groups()
    return int(reused), int(todo)


def _parent_metrics(uri: str) -> list[dict]:
    """Per parent run, oldest first: its params and its children's metrics by draft."""
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id])
    parents = sorted((r for r in runs if r.data.tags.get(ROLE) == "sweep"), key=lambda r: r.info.start_time)
    result = []
    for parent in parents:
        children = [r for r in runs if r.data.tags.get(PARENT) == parent.info.run_id]
        metrics = {r.data.tags["draft"]: r.data.metrics for r in children}
        result.append({"params": parent.data.params, "metrics": metrics, "status": parent.info.status})
    return result


def test_a_changed_setting_recomputes_exactly_what_it_changes(
    finished_smoke: FinishedSweep, tmp_path: Path
) -> None:
    uri = finished_smoke.copy_to(tmp_path)
    lock = tmp_path / "smoke" / FOLDER_LOCK

    def command(*overrides: str) -> list[str]:  # the timing of the finished sweep (its step costs reused)
        return smoke_command(tmp_path, uri, COARSE_TIMING, *overrides)

    def run(*overrides: str, dry: bool = False):
        result = run_cli(command(*overrides) + (["--dry-run"] if dry else []), tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    trained = finished_drafts(tmp_path)
    cells = tmp_path / "smoke" / "cells"
    assert len(trained) == 4 and len(list(cells.glob("*.json"))) == CELLS

    # γ 3 -> 6: the plan says why, every cell is evaluated again, no draft is retrained
    dry = run("eval.gamma=6", dry=True)
    plan = _plan(dry.stdout)
    assert _counts(plan["drafts"]) == (4, 0) and _counts(plan["cells"]) == (0, CELLS)
    assert "eval.gamma 3 → 6" in plan["cells"]
    assert len(_parent_metrics(uri)) == 1  # a dry run tracks nothing
    holder = _start(command("eval.gamma=6"), tmp_path)
    wait_until(lambda: _held_by(lock, holder), "the run to hold its output folder")
    assert holder.poll() is None, holder.communicate()[1][-3000:]
    # a second run on the held folder: refused before any work, in one line naming the holder
    refused = run_cli(command("eval.gamma=6"), tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and f"is in use by pid {holder.pid} on " in lines[0], refused.stderr[-3000:]
    stdout, stderr = holder.communicate(timeout=CLI_TIMEOUT_S)
    assert holder.returncode == 0, stderr[-3000:]
    assert finished_drafts(tmp_path) == trained
    assert len(list(cells.glob("*.json"))) == 2 * CELLS
    old, new = _parent_metrics(uri)  # the refused run left no parent run behind
    assert new["params"]["eval.gamma"] == "[6]" and new["status"] == "FINISHED"
    key = "block_efficiency/in_domain/tau_dec_1"
    for draft, metrics in new["metrics"].items():  # the new parent holds γ = 6 numbers, not γ = 3 ones
        assert metrics[key] != old["metrics"][draft][key], draft
        assert 1.0 <= metrics[key] <= 7.0
    records = [json.loads(p.read_text()) for p in cells.glob("*.json")]
    assert sorted({r["gamma"] for r in records}) == [3, 6]
    # the step costs are re-timed: a verification pass over γ + 1 = 7 tokens is another pass
    assert "step costs      0 reused, 1 to compute (eval.gamma [3] → [6])" in stdout

    # a holder killed with SIGKILL takes its lock with it (killed as soon as it holds the folder: before
    # any work); then damaged files: a draft's weights cut short after it was published, a cell record cut
    # mid-write. One run then changes the divergence and meets the damage (a run costs about a minute):
    # fkl -> tvd retrains the online drafts, the damaged offline draft is retrained and the cut cell
    # recomputed, each with its reason; the other offline draft and its cells are reused
    killed = _start(command("distill.divergence=tvd"), tmp_path)
    wait_until(lambda: _held_by(lock, killed), "the next run to hold its output folder")
    if killed.poll() is None:
        os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    damaged = tmp_path / "smoke" / "drafts" / "offline__tau_kd=0"
    weights = damaged / "model.safetensors"
    half = weights.stat().st_size // 2
    weights.write_bytes(weights.read_bytes()[:half])
    # a cell of the current settings: one of the offline draft that no change retrains
    cell = next(
        p
        for p in sorted(cells.glob("*.json"))
        if (record := json.loads(p.read_text()))["gamma"] == 3 and record["draft"] == "offline/tau_kd=1"
    )
    cell.write_text(cell.read_text()[:40])
    third = run("distill.divergence=tvd")  # the dead holder's lock went with it
    assert "is in use by" not in third.stderr
    plan = _plan(third.stdout)
    assert _counts(plan["drafts"]) == (1, 3), plan
    assert "distill.divergence fkl → tvd ×2" in plan["drafts"], plan
    assert "retrain (weights differ from finished.json)" in plan["drafts"], plan
    after = finished_drafts(tmp_path)
    for name in trained:  # the online drafts and the damaged one retrained, the other offline one reused
        assert (after[name] == trained[name]) == (name == "offline__tau_kd=1"), name
    # online cells recomputed (their draft changed) and the cut one; the rest reused (the retrained
    # offline draft has its key: its cells stand)
    online_cells = 2 * CELLS_PER_DRAFT
    assert _counts(plan["cells"]) == (CELLS - online_cells - 1, online_cells + 1), plan
    assert "the draft changed" in plan["cells"] and "unreadable (truncated or corrupt)" in plan["cells"], plan
    aside = list(damaged.parent.glob("offline__tau_kd=0.damaged-*"))
    assert len(aside) == 1 and (aside[0] / "model.safetensors").stat().st_size == half
    after = finished_drafts(tmp_path)
    assert set(after) == set(trained) and len(list(cells.glob("*.json"))) == 2 * CELLS + 2 * CELLS_PER_DRAFT
    # the same command again: nothing to compute, and the plan says so
    plan = _plan(run("distill.divergence=tvd", dry=True).stdout)
    for stage in ("teacher shards", "drafts", "step costs", "cells"):
        assert _counts(plan[stage])[1] == 0, (stage, plan[stage])

    # two training replicates: replicate 0 is the draft just made (reused under its key), replicate 1 new
    fourth = run("distill.divergence=tvd", "distill.replicates=2")
    plan = _plan(fourth.stdout)
    assert plan["drafts"] == "4 reused, 4 to compute (new ×4)"
    assert _counts(plan["cells"]) == (CELLS, 4 * CELLS_PER_DRAFT)
    replicated = finished_drafts(tmp_path)
    assert {name: replicated[name] for name in after} == after  # replicate 0 untouched
    assert sorted(set(replicated) - set(after)) == sorted(f"{name}__r1" for name in after)
    drafts = tmp_path / "smoke" / "drafts"
    keys = {json.loads((drafts / n / "finished.json").read_text())["fingerprint"] for n in replicated}
    assert len(keys) == 8  # every replicate its own draft
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id])
    parent = max((r for r in runs if r.data.tags.get(ROLE) == "sweep"), key=lambda r: r.info.start_time)
    children = [r for r in runs if r.data.tags.get(PARENT) == parent.info.run_id]
    tags = {r.data.tags["draft"]: r.data.tags.get("replicate") for r in children}
    assert tags == {"non-distill": "0"} | {
        name.replace("__", "/"): ("1" if name.endswith("__r1") else "0") for name in replicated
    }
    report = (tmp_path / "smoke" / "report" / "report.md").read_text()
    assert "## Training replicates" in report and "replicates agree" in report
    assert "## DistillSpec" not in report  # one divergence, one data source

    # DistillSpec's grid, two divergences × two data sources at τ_kd 1: four online drafts, each its own
    # key; the (divergence, source) pairs evaluated before under another name reuse their cells
    grid = ("teacher.temperatures=[1.0]", "distill.divergence=[fkl, tvd]")
    fifth = run(*grid, "distill.data_sources=[tempspec_teacher, gkd]")
    plan = _plan(fifth.stdout)
    assert plan["drafts"] == "1 reused, 4 to compute (new ×4)"
    assert _counts(plan["cells"]) == (4 * CELLS_PER_DRAFT, 2 * CELLS_PER_DRAFT)
    names = [f"online/tau_kd=1/{d}/{s}" for d in ("fkl", "tvd") for s in ("tempspec_teacher", "gkd")]
    assert {name.replace("/", "__") for name in names} <= set(finished_drafts(tmp_path))
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id])
    parent = max((r for r in runs if r.data.tags.get(ROLE) == "sweep"), key=lambda r: r.info.start_time)
    children = {r.data.tags["draft"]: r for r in runs if r.data.tags.get(PARENT) == parent.info.run_id}
    assert sorted(children) == sorted(["non-distill", "offline/tau_kd=1", *names])
    for name in names:
        tags, metrics = children[name].data.tags, children[name].data.metrics
        assert name.endswith(f"/{tags['divergence']}/{tags['data_source']}"), tags
        assert "block_efficiency/in_domain/tau_dec_1" in metrics, name
    report = (tmp_path / "smoke" / "report" / "report.md").read_text()
    section = report.split("## DistillSpec: KD algorithm × divergence", 1)[1].split("\n## ", 1)[0]
    assert "GKD" in section and "tempspec_teacher" in section and "tvd" in section
    assert "distillspec_block_efficiency_sampled_in_domain_tau_kd=1.png" in section
    assert distillspec.GKD_NEAR_BEST in section
    assert "distillspec_per_example.png" in section  # Fig. 3b
    assert distillspec_prompts.WHITE_BOX in section and distillspec_prompts.MOST_IMPROVE in section
