"""Results files (specray/cli/results.py): what a finished run writes when SPECRAY_RECORD names a file, and
how a page's blocks and inline figures are rendered from it."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from specray.cli import results
from specray.config.models import ModelRef, ModelsSpec
from specray.named_files import named_entry
from specray.specdec.records import StepCosts

REPORT = """# Report

## Verdicts

| claim | scope | effect | verdict |
|---|---|---:|---|
| speedup falls as τ_dec rises | offline | −0.3 | reproduced |
| online beats offline | in-domain | +0.2 | **not reproduced** |

## Peaks

| draft | speedup |
|---|---:|
| a | 1.2 |
"""


def finished_run(tmp_path):
    (tmp_path / "report.md").write_text(REPORT)
    return SimpleNamespace(
        stages={
            "zoo": {"seconds": 216.04, "peak_gib": 1.234},
            "teacher shards": {"seconds": 35.0, "peak_gib": 2.0},
        },
        step_costs=StepCosts.fixed(0.2),
        records=[SimpleNamespace(draft="a"), SimpleNamespace(draft="a"), SimpleNamespace(draft="b")],
        report=tmp_path / "report.md",
    )


def test_a_finished_run_writes_its_results_file(tmp_path, monkeypatch) -> None:
    target = tmp_path / "docs" / "results" / "tiny.json"
    monkeypatch.setenv(results.RECORD_ENV, str(target))
    monkeypatch.setenv(results.SINCE_ENV, str(time.time() - 1000))
    monkeypatch.setenv(results.COMMAND_ENV, "make demo")
    monkeypatch.setattr(results, "_model_sizes", lambda spec: {"draft_parameters": 460160})
    monkeypatch.setattr(results, "_model_files", lambda spec: {})
    assert results.record_run(SimpleNamespace(name="tiny"), finished_run(tmp_path)) == target
    written = json.loads(target.read_text())
    assert written["name"] == "tiny" and written["command"] == "make demo" and written["sweep"] == "tiny"
    assert {"commit", "date", "machine", "specray"} <= set(written)
    figures = written["figures"]
    assert 999 < figures["wall_seconds"] < 1100
    assert figures["stages"]["teacher_shards"] == {"seconds": 35.0, "peak_gib": 2.0}
    assert (figures["c"], figures["cells"], figures["drafts"]) == (0.2, 3, 2)
    assert figures["verdicts"] == {"reproduced": 1, "not_reproduced": 1, "inconclusive": 0}
    assert list(written["tables"]) == ["Verdicts"]  # the table without a verdict column is not kept
    page = "<!--r:tiny.stages.zoo.seconds-->3 min<!--/r-->.\n\n<!-- results tiny -->\n<!-- /results -->\n"
    shown = results.rendered(page, {"tiny": written})
    assert results.quote_problems(shown, {"tiny": written}) == []
    assert "| models.draft_parameters | 0.46M |" in shown and "| verdicts.not_reproduced | 1 |" in shown


def test_a_gguf_model_is_recorded_by_its_file_and_hash() -> None:
    models = ModelsSpec(target=ModelRef(gguf="smollm2-135m-instruct"), draft=ModelRef(cut={"layers": 2}))
    files = results._model_files(SimpleNamespace(models=models))
    sha256 = named_entry("smollm2-135m-instruct").sha256
    assert files == {"target": {"file": "SmolLM2-135M-Instruct.Q4_1.gguf", "sha256": sha256}}
    zoo = ModelsSpec(target=ModelRef(zoo="target"), draft=ModelRef(zoo="draft"))
    assert results._model_files(SimpleNamespace(models=zoo)) == {}


def test_export_verify_records_one_row_per_band_with_both_checks(tmp_path, monkeypatch) -> None:
    from specray.serving.verify import BandCheck

    def check(tau: float, route: str, hf: float, ours: float) -> BandCheck:
        return BandCheck(
            alias=f"t{tau:g}", tau_dec=tau, draft="offline__tau_kd=0", gamma=2, prompts=8, steps=100,
            drafted=200, accepted=60, draft_acceptance=hf, draft_acceptance_ci95=0.05,
            predicted_draft_acceptance=0.30, predicted_draft_acceptance_ci95=0.01,
            mean_acceptance_length=1.6, mean_acceptance_length_ci95=0.1, predicted_mean_acceptance_length=1.6,
            speedup=1.0, speedup_ci95=0.1, predicted_speedup=1.20, predicted_speedup_basis="modelled",
            seconds=9.0, ours_speedup=ours, ours_speedup_ci95=0.08, hf_overhead_ms_per_step=3.0, route=route,
        )  # fmt: skip

    target = tmp_path / "verify_tiny.json"
    monkeypatch.setenv(results.RECORD_ENV, str(target))
    checks = [check(0.0, "speculative", 0.32, 1.19), check(1.5, "speculative", 0.20, 1.05)]
    checks.append(check(2.0, "declined", 0.31, 1.21))
    assert results.record_checks(checks) == target
    written = json.loads(target.read_text())
    figures = written["figures"]
    assert (figures["bands_checked"], figures["bands_routed"]) == (3, 2)
    assert (figures["hf_inside"], figures["ours_within_10pct"]) == (2, 2)  # τ 1.5 misses both
    rows = written["tables"]["Bands"]
    assert [row["band"] for row in rows] == ["τ 0", "τ 1.5", "τ 2"]
    assert rows[1]["checks"] == "HF OUTSIDE, ours OUTSIDE ±10%" and rows[2]["route"] == "declined"
    assert rows[0]["specray's decoder: speedup (plan)"] == "1.190 ± 0.080 (1.200, modelled)"
    monkeypatch.delenv(results.RECORD_ENV)
    assert results.record_checks(checks) is None


def test_without_SPECRAY_RECORD_nothing_is_written(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(results.RECORD_ENV, raising=False)
    assert results.record_run(SimpleNamespace(name="tiny"), finished_run(tmp_path)) is None


def test_parameters_are_counted_from_the_safetensors_without_loading_a_model(tmp_path) -> None:
    save_file(
        {"embed": torch.zeros(1024, 128), "head": torch.zeros(128, 1024), "norm": torch.ones(128)},
        str(tmp_path / "model.safetensors"),
    )
    assert results.safetensors_parameters(tmp_path) == 2 * 1024 * 128 + 128


def test_figures_are_shown_the_way_pages_quote_them() -> None:
    shown = {
        "wall_seconds": (1896, "31 min 36 s"),
        "stages.eval.seconds": (84.4, "84 s"),
        "zoo_build_seconds": (3960, "1 h 6 min"),
        "models.target_parameters": (5270784, "5.27M"),
        "online_draft_ratio": (0.399, "0.40x"),
        "c": (0.2341, "0.234"),
        "stages.zoo.peak_gib": (6.2, "6.20 GiB"),
        "cells": (386, "386"),
    }
    for path, (value, text) in shown.items():
        assert results.format_figure(path, value) == text, path
