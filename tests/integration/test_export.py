"""`specray export` on a finished smoke sweep, through the real CLI: every file of an export, the MLflow
registry (a version per chosen draft, an alias per band), the same plan from the MLflow parent run id, the
router on the written routing.json, and `--verify` with HF assisted generation."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from specray.config import dump_spec, load_spec
from specray.serving.router import Router
from tests.integration.conftest import FinishedSweep
from tests.sweeps import SPECRAY
from tests.waiting import CLI_TIMEOUT_S

pytestmark = pytest.mark.integration


def cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([SPECRAY, *argv], cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result


@pytest.fixture(scope="module")
def smoke(finished_smoke: FinishedSweep, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A finished smoke sweep of this module's own (a copy of the session's): its output folder and
    tracking URI."""
    root = tmp_path_factory.mktemp("export")
    uri = finished_smoke.copy_to(root)
    return root / "smoke", uri


def test_export_writes_every_file_and_registers_the_drafts(smoke, tmp_path: Path) -> None:
    folder, uri = smoke
    # --min-speedup 0: on the smoke zoo (c ≈ 0.7) nothing beats target-only decoding; route every band
    cli("export", str(folder), "--to", str(tmp_path / "export"), "--min-speedup", "0", cwd=tmp_path)
    export = tmp_path / "export"
    plan = json.loads((export / "routing.json").read_text())
    assert [band["alias"] for band in plan["bands"]] == ["tau-0", "tau-1"]  # smoke's τ_dec {0, 1}
    assert [(band["low"], band["high"]) for band in plan["bands"]] == [(0.0, 0.5), (0.5, None)]
    assert plan["engines"] == {"vllm": "0.33.0", "sglang": "0.5.23"}
    for band in plan["bands"]:
        assert band["route"] == "speculative" and band["gamma"] == 3
        draft = export / band["draft"]
        assert (draft / "model.safetensors").is_file() and (draft / "tokenizer.json").is_file()
        config = json.loads((draft / "config.json").read_text())
        assert "speculators_config" not in config  # vLLM would take it for a speculators checkpoint
        meta = config["specray_config"]
        assert meta["verifier"]["vocab_size"] == config["vocab_size"]
        assert meta["sweep"]["draft_key"] == band["draft_key"] and meta["sweep"]["spec_key"]
        assert band["alias"] in [m["temperature_band"]["alias"] for m in meta["proposal_methods"]]
        assert {m["speculative_tokens"] for m in meta["proposal_methods"]} == {3}
        for engine in ("vllm", "sglang"):
            assert (export / engine / f"{band['alias']}.json").is_file()
            assert (export / engine / f"{band['alias']}.sh").is_file()
        assert (
            json.loads((export / "vllm" / f"{band['alias']}.json").read_text())["num_speculative_tokens"] == 3
        )
        assert "--speculative-num-draft-tokens 4" in (export / "sglang" / f"{band['alias']}.sh").read_text()
    assert "| [0, 0.5) | 0 |" in (export / "README.md").read_text()

    client = MlflowClient(tracking_uri=uri)
    model = client.get_registered_model("smoke-serving-draft")
    assert set(model.aliases) == {"tau-0", "tau-1"}
    for band in plan["bands"]:
        version = client.get_model_version("smoke-serving-draft", model.aliases[band["alias"]])
        assert version.tags["draft_key"] == band["draft_key"]
        assert version.source.endswith(f"export/{band['draft']}")
    run = client.get_run(version.run_id)
    assert "export" in {a.path for a in client.list_artifacts(run.info.run_id)}

    router = Router.from_file(export / "routing.json")
    assert router.route(0.49).draft_dir == export / plan["bands"][0]["draft"]
    assert router.route(0.5).gamma == 3


def test_the_same_plan_from_the_parent_run_and_no_speculation_by_default(smoke, tmp_path: Path) -> None:
    folder, uri = smoke
    client = MlflowClient(tracking_uri=uri)
    (parent,) = client.search_runs(
        [client.get_experiment_by_name("smoke").experiment_id], "tags.`specray.role` = 'sweep'"
    )
    from_run = tmp_path / "from_run"
    cli(
        "export",
        parent.info.run_id,
        "--tracking-uri",
        uri,
        "--to",
        str(from_run),
        "--no-register",
        cwd=tmp_path,
    )
    from_folder = tmp_path / "from_folder"
    cli("export", str(folder), "--to", str(from_folder), "--no-register", cwd=tmp_path)
    plans = [json.loads((f / "routing.json").read_text())["bands"] for f in (from_run, from_folder)]
    assert [[(b["route"], b.get("draft_key"), b.get("gamma")) for b in p] for p in plans][0] == [
        (b["route"], b.get("draft_key"), b.get("gamma")) for b in plans[1]
    ]
    # c ≈ 0.7 on the smoke zoo: at τ = 1 no draft's interval lies above 1
    assert plans[1][-1]["route"] == "none" and "no speculation" in plans[1][-1]["reason"]
    assert not (from_folder / "vllm" / "tau-1.json").exists()
    assert "--speculative" not in (from_folder / "vllm" / "tau-1.sh").read_text()


def test_verify_measures_hf_assisted_generation_beside_the_plan(smoke, tmp_path: Path) -> None:
    folder, _ = smoke
    export = tmp_path / "verified"
    argv = ["export", str(folder), "--to", str(export), "--min-speedup", "0", "--no-register", "--verify"]
    result = subprocess.run(
        [SPECRAY, *argv, "--verify-prompts", "16"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert "verify tau-0" in result.stdout and "verify tau-1" in result.stdout, result.stderr[-3000:]
    checks = {check["alias"]: check for check in json.loads((export / "verify.json").read_text())}
    greedy = checks["tau-0"]
    # at τ = 0 acceptance is deterministic along the target's greedy output: HF's counts are the plan's
    assert greedy["draft_acceptance"] == pytest.approx(greedy["predicted_draft_acceptance"], abs=1e-9)
    assert greedy["mean_acceptance_length"] == pytest.approx(
        greedy["predicted_mean_acceptance_length"], abs=1e-9
    )
    for check in checks.values():
        assert check["drafted"] > 0 and check["steps"] > 0 and check["speedup"] > 0
        assert check["route"] == "speculative"  # --min-speedup 0 routes every band
        # specray's own decoder timed on the same prompts, and what HF spends per step beyond it
        assert check["ours_speedup"] > 0 and math.isfinite(check["hf_overhead_ms_per_step"])
        assert check["ours_agrees"] == (abs(check["predicted_speedup"] / check["ours_speedup"] - 1) <= 0.1)
    # exit code 0 iff every band agrees with HF's interval and, within ±10%, with specray's decoder
    agreed = all(check["agrees"] and check["ours_agrees"] for check in checks.values())
    assert (result.returncode == 0) == agreed


def test_export_data_writes_the_sweeps_tau_kd_for_both_trainers(smoke, tmp_path: Path) -> None:
    """`specray export-data` on the finished sweep folder: every τ_kd in both formats, held to the trainers'
    rules, counts and hashes as the manifest says; bad requests are one line each."""
    from specray.serving.trainer_data import check_export
    from tests.trainer_rules import specforge_problems, speculators_problems

    folder, _ = smoke
    to = tmp_path / "data"
    result = cli("export-data", str(folder), "--to", str(to), cwd=tmp_path)
    manifest = json.loads((to / "manifest.json").read_text())
    assert [r["name"] for r in manifest["recipes"]] == ["tau_kd=0", "tau_kd=1"]
    assert "tau_kd=0: τ_kd 0: " in result.stdout and "manifest:" in result.stdout
    for recipe in manifest["recipes"]:
        ((tau, rows),) = recipe["rows_per_tau_kd"].items()
        assert rows + recipe["skipped_blank_responses"] == manifest["shards"][tau]["rows"] == 64  # train_size
        assert specforge_problems(to / recipe["files"]["specforge"]["path"]) == []
        assert speculators_problems(to / recipe["files"]["speculators"]["path"]) == []
    assert check_export(to) == []
    for argv, needle in (
        (["--tau-kd", "0.5"], "error: --tau-kd 0.5: not in the run's τ_kd grid (0, 1)"),
        (["--recipe", "nope"], "error: --recipe 'nope': not a recipe of the run (offline/tau_kd=0, "),
    ):
        bad = subprocess.run(
            [SPECRAY, "export-data", str(folder), "--to", str(tmp_path / "bad"), *argv],
            capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
        )  # fmt: skip
        assert bad.returncode == 2 and bad.stderr.startswith(needle), bad.stderr[-2000:]
        assert len(bad.stderr.strip().splitlines()) == 1
    missing = subprocess.run(
        [SPECRAY, "export-data", str(tmp_path / "nowhere"), "--to", str(tmp_path / "bad")],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    assert missing.returncode == 2 and missing.stderr.strip() == (
        f"error: {tmp_path / 'nowhere'}: no such folder (an MLflow run id needs --tracking-uri)"
    )
    unfinished = tmp_path / "unfinished"
    shutil.copytree(folder, unfinished / "smoke")
    spec_file = unfinished / "smoke" / "spec.yaml"  # the copy's spec names the copy
    spec_file.write_text(dump_spec(load_spec(spec_file, [f"output_dir={unfinished}"])))
    next((unfinished / "smoke" / "cells").glob("*.json")).unlink()  # a cell the sweep has yet to compute
    stopped = subprocess.run(
        [SPECRAY, "export-data", str(unfinished / "smoke"), "--to", str(tmp_path / "bad")],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    assert stopped.returncode == 2 and len(stopped.stderr.strip().splitlines()) == 1, stopped.stderr[-2000:]
    assert "1 cells of the current settings are missing" in stopped.stderr
    assert not (tmp_path / "bad").exists()  # refused before any file
