"""The smoke sweep with a Spec-Bench test set, as a user writes it: MT-bench's questions through the chat
template, the `mt_bench` workload — per-category figures in the records, MLflow and the report, and the
teacher's prompts rendered by the chat template with one BOS."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from mlflow.tracking import MlflowClient

from specray.config import load_spec
from specray.config.vocabulary import MT_BENCH_CATEGORIES
from specray.data.shards import SHARD_FILE, shard_dir
from specray.keys import train_shard_keys
from specray.tracking.names import ROLE
from tests.stores import new_store
from tests.sweeps import SMOKE, SPECRAY, run_cli

pytestmark = pytest.mark.integration


def bench_sweep(tmp_path: Path, questions: Path) -> Path:
    raw = load_spec(SMOKE).model_dump(mode="json")
    raw["name"] = "smoke-mt"
    raw["data"]["template"] = "chat"
    source = {"kind": "spec_bench", "path": str(questions), "categories": ["mt_bench"]}
    raw["data"]["test_sets"] = {"mt": {"source": source, "size": 16}}
    raw["teacher"]["temperatures"] = [1.0]
    raw["distill"]["paradigms"] = ["offline"]
    raw["eval"] |= {
        "test_sets": ["mt"],
        "temperatures": [0.0, 0.1, 0.7],
        "empirical_temperatures": [0.7],
        "workload": {"test_set": "mt", "temperatures": "mt_bench"},
        # c given, not timed: MT-bench's 256-token contexts on a machine the other tests keep busy took the
        # timing to its cap (200 rounds, ~100 s) in CI even at ±50%; the stage is checked on the smoke sweep
        "draft_cost_ratio": 0.5,
    }
    path = tmp_path / "smoke_mt.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_spec_bench_test_set_under_the_chat_template(tmp_path: Path, shared_data: Path) -> None:
    questions = shared_data / "spec_bench" / "question.jsonl"
    uri = new_store(tmp_path)
    command = [SPECRAY, "run", str(bench_sweep(tmp_path, questions)), f"tracking.uri={uri}"]
    # a few minutes' work: a hang fails in 15 min rather than CLI_TIMEOUT_S's 30, keeping CI in its budget
    result = run_cli([*command, f"output_dir={tmp_path}"], cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]

    # the records: every analytic cell of the test set keeps its figures per MT-bench category
    cells = [json.loads(p.read_text()) for p in (tmp_path / "smoke-mt" / "cells").glob("*.json")]
    analytic = [c for c in cells if c["estimator"] == "analytic" and c["test_set"] == "mt"]
    assert len(analytic) == 2 * 3  # (non-distill, offline/tau_kd=1) × 3 τ_dec
    for cell in analytic:
        labels = cell["metrics"]["prompt_categories"]
        assert len(labels) == 2 * 16 and set(labels) <= set(MT_BENCH_CATEGORIES)  # two turns each
        by_category = cell["metrics"]["by_category"]
        assert set(by_category) == set(labels)
        assert sum(f["prompts"] for f in by_category.values()) == 2 * 16
        # the categories' tokens-weighted α gives back the cell's
        tokens = {
            c: sum(t for t, lab in zip(cell["metrics"]["per_prompt_tokens"], labels, strict=True) if lab == c)
            for c in by_category
        }
        pooled = sum(by_category[c]["acceptance_rate"] * tokens[c] for c in tokens) / sum(tokens.values())
        assert pooled == pytest.approx(cell["metrics"]["acceptance_rate"], rel=1e-6)
        assert all("mean_acceptance_length" in f for f in by_category.values())  # the server metrics
    # the empirical cells: measured figures per category of the prompts they decoded (the first 4)
    empirical = [c for c in cells if c["estimator"] == "empirical" and c["test_set"] == "mt"]
    assert len(empirical) == 2
    for cell in empirical:
        labels = cell["metrics"]["prompt_categories"]
        assert len(labels) == 4 and set(cell["metrics"]["by_category"]) == set(labels)
        assert all("speedup" in f for f in cell["metrics"]["by_category"].values())

    # MLflow: the per-category metrics on the drafts' runs
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("smoke-mt").experiment_id
    runs = client.search_runs([experiment])
    child = next(r for r in runs if r.data.tags.get("draft") == "offline/tau_kd=1")
    category = analytic[0]["metrics"]["prompt_categories"][0]
    assert f"speedup_model/mt/tau_dec_0.7/category_{category}" in child.data.metrics
    assert f"acceptance_rate/mt/tau_dec_0/category_{category}" in child.data.metrics
    assert f"speedup/mt/tau_dec_0.7/category_{category}" in child.data.metrics  # measured
    parent = next(r for r in runs if r.data.tags.get(ROLE) == "sweep")
    assert parent.info.status == "FINISHED"

    # the report: the per-category table and the workload's weighted speedup per draft
    report = (tmp_path / "smoke-mt" / "report" / "report.md").read_text()
    assert "## Per category: mt" in report and "### Workload on mt" in report
    workload = report.split("### Workload on mt")[1]
    assert "offline/tau_kd=1" in workload and "non-distill" in workload

    # the export: the routing plan's workload-weighted speedup, from the cells' per-category figures
    export = tmp_path / "export"
    exported = run_cli(
        [SPECRAY, "export", str(tmp_path / "smoke-mt"), "--to", str(export), "--test-set", "mt"], cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "workload on mt: the plan's weighted speedup" in exported.stdout
    routing = json.loads((export / "routing.json").read_text())
    block = routing["workload"]
    assert {c["category"] for c in block["categories"]} == set(analytic[0]["metrics"]["by_category"])
    assert sum(c["weight"] for c in block["categories"]) == pytest.approx(1.0)
    assert block["plan_speedup"] == pytest.approx(
        sum(c["weight"] * c["speedup_model"] for c in block["categories"])
    )
    assert {d["draft"] for d in block["drafts"]} == {"non-distill", "offline/tau_kd=1"}

    # the teacher's prompts went through the chat template: one BOS, the template's own
    # (this run's own shards only: the session's cache holds other tests' shards, some damaged on purpose)
    spec = load_spec(bench_sweep(tmp_path, questions), [f"output_dir={tmp_path}"])
    shards = [pq.read_table(shard_dir(key) / SHARD_FILE) for key in train_shard_keys(spec).values()]
    rows = [r for t in shards if "prompt_token_ids" in t.column_names for r in t.to_pylist()]
    chat_rows = [r for r in rows if r["prompt"].startswith("<s>")]
    assert chat_rows, "no teacher row was rendered by the chat template"
    for row in chat_rows:
        ids = row["prompt_token_ids"]
        assert ids.count(ids[0]) == 1 and ids[1] != ids[0], row["prompt"][:80]
