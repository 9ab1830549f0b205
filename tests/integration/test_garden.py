"""A model garden through the real CLI, Ray and MLflow: two zoo sizes (a one-model ladder beside the smoke
zoo's target), the smaller distilled from the larger, a draft distilled from each target, every point
measured — the report's garden section, the MLflow runs, and a re-run that reuses everything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from specray.config import load_spec
from specray.tracking.names import ROLE
from tests.stores import new_store
from tests.sweeps import SMOKE, SPECRAY, run_cli

pytestmark = pytest.mark.integration


def garden_file(tmp_path: Path) -> Path:
    raw = load_spec(SMOKE).model_dump(mode="json")
    raw["name"] = "garden-smoke"
    small = {"hidden_size": 48, "num_layers": 1, "num_heads": 2, "intermediate_size": 128, "train_steps": 6}
    raw["models"]["zoo"]["ladder"] = {"small": small | {"lr": 3e-3}}
    raw["models"]["garden"] = [{"zoo": "small"}, {"zoo": "target"}]
    raw["teacher"]["temperatures"] = [1.0]
    raw["data"] |= {"train_size": 16, "validation_size": 8}
    raw["distill"] |= {"steps": 2, "checkpoint_every": 2, "report_every": 2, "max_new_tokens": 8}
    raw["eval"] |= {
        "temperatures": [1.0],
        "empirical_temperatures": [1.0],
        "gamma": [3],
        "repeats": 1,
        "max_new_tokens": 8,
        "empirical_prompts": 3,
        "lenience": {"function": ["lin"], "epsilon": [1.0, 0.5]},
    }
    path = tmp_path / "garden.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_garden_runs_end_to_end_and_a_re_run_reuses_it(tmp_path: Path) -> None:
    uri = new_store(tmp_path)
    command = [SPECRAY, "garden", str(garden_file(tmp_path)), f"tracking.uri={uri}", f"output_dir={tmp_path}"]
    result = run_cli(command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "distils 1 targets and 3 drafts" in result.stdout

    out = tmp_path / "garden-smoke"
    targets = list((out / "garden" / "targets").glob("small-distilled-*"))
    drafts = sorted(p.name.rsplit("-", 1)[0] for p in (out / "garden" / "drafts").iterdir())
    assert len(targets) == 1 and drafts == ["draft-of-small", "draft-of-small-distilled", "draft-of-target"]
    # points: raw ×2, distilled ×2, speculative ×2, speculative_kd ×2, distillspec ×2, lossy ×2; the
    # teacher's distilled and DistillSpec points are its raw and KD-draft ones: 12 listed, 10 measured
    saved = [json.loads(p.read_text()) for p in (out / "garden" / "points").glob("*.json")]
    assert len(saved) == 10
    for payload in saved:
        assert len(payload["seconds"]) == 3 and all(t > 0 for t in payload["tokens"])

    report = (out / "report" / "report.md").read_text()
    assert "## Model garden" in report and "Latency reduction at matched quality" in report
    for curve in ("raw", "distilled", "speculative", "speculative_kd", "distillspec", "distillspec_lossy"):
        assert f"| {curve} " in report, curve
    assert (out / "report" / "garden_quality_latency.png").stat().st_size > 0

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("garden-smoke").experiment_id
    runs = client.search_runs([experiment])
    parent = next(r for r in runs if r.data.tags.get(ROLE) == "garden")
    assert parent.info.status == "FINISHED"
    assert "garden/raw/small/tau_dec_1/latency_ms_per_token" in parent.data.metrics
    assert (
        "garden/distillspec_lossy/small-distilled/tau_dec_1/gamma_3/lin_eps_0.5/quality"
        in parent.data.metrics
    )
    children = [r for r in runs if r.data.tags.get("garden_role")]
    assert sorted(r.data.tags["garden_role"] for r in children) == ["draft"] * 3 + ["target"]
    assert all("loss" in r.data.metrics for r in children)

    # --dry-run: the plan against the disk, every model distilled already; nothing run
    dry = run_cli([*command, "--dry-run"], cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert dry.stdout.count("  finished") == 4 and "to distill" not in dry.stdout, dry.stdout
    assert "12 points; train split" in dry.stdout and "nothing run" in dry.stdout, dry.stdout

    # a re-run finds every distilled model and point under its key: nothing is trained or measured again
    before = {p: p.stat().st_mtime_ns for p in (out / "garden").rglob("*") if p.is_file()}
    again = run_cli(command, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    after = {p: p.stat().st_mtime_ns for p in (out / "garden").rglob("*") if p.is_file()}
    assert after == before

    # `specray report` rebuilds the same report from what the parent run holds in MLflow
    args = ["report", parent.info.run_id, "--tracking-uri", uri, "--output", str(tmp_path / "rebuilt")]
    rebuilt = run_cli([SPECRAY, *args], cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert (tmp_path / "rebuilt" / "report.md").read_text() == report
    assert (tmp_path / "rebuilt" / "garden_quality_latency.png").stat().st_size > 0
    child = run_cli([SPECRAY, "report", children[0].info.run_id, "--tracking-uri", uri], cwd=tmp_path)
    assert child.returncode == 2 and "allowed: sweep, garden" in child.stderr, child.stderr[-3000:]
