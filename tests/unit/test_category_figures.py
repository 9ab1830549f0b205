"""Per-category figures of a cell (analytic and empirical), a workload's weighted speedup and its interval,
the report's per-category section, and the export's workload block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from specray.metrics import BY_CATEGORY
from specray.report import categories as report_categories
from specray.report.paired import prompt_cells
from specray.specdec.categories import category_figures, with_categories
from specray.specdec.records import CellRecord
from specray.tracking.names import cell_metrics
from tests.bench_sets import SMOKE_SPEC, with_bench

# ---------------------------------------------------------------- per-category figures

LABELS = ["a", "a", "b", "b", "b"]
TERMS = {"target_step": 1.0, "per_drafted_token": 0.1}


def analytic_metrics(tokens: list[int], calls: list[float], beta: list[float]) -> dict[str, Any]:
    return {
        "per_prompt_tokens": tokens,
        "per_prompt_target_calls": calls,
        "per_prompt_beta_sum": beta,
        "per_prompt_drafted": [3.0 * c for c in calls],
        "cost_terms": TERMS,
        "speedup_model": 1.0,
    }


def test_category_figures_are_the_cell_figures_over_its_prompts() -> None:
    metrics = analytic_metrics([10, 10, 8, 8, 8], [5, 5, 2, 2, 2], [6, 4, 7, 7, 7])
    figures = category_figures(metrics, LABELS)
    assert figures["a"] == pytest.approx(
        {"acceptance_rate": 0.5, "block_efficiency": 2.0, "speedup_model": 10 / (5 + 0.1 * 15), "prompts": 2}
    )
    assert figures["b"]["acceptance_rate"] == pytest.approx(21 / 24)
    assert figures["b"]["block_efficiency"] == pytest.approx(4.0)
    assert figures["b"]["speedup_model"] == pytest.approx(8 / (2 + 0.1 * 6))  # CostTerms of the means
    assert category_figures(metrics, LABELS[:4]) == {}  # prompts that do not match the cell's
    # the server metrics, from the expected accepted tokens (vLLM's definitions over the category)
    served = category_figures(metrics | {"per_prompt_accepted": [4, 4, 5, 5, 5]}, LABELS)
    assert served["a"]["mean_acceptance_length"] == pytest.approx(1 + 8 / 10)
    assert served["b"]["draft_acceptance"] == pytest.approx(15 / 18)


def empirical_metrics() -> dict[str, Any]:
    """Three decoded prompts (of a five-prompt test set): counts and seconds summed over repeats."""
    return {
        "per_prompt_tokens": [12, 8, 10],
        "per_prompt_target_calls": [4, 4, 5],
        "per_prompt_accepted": [8, 4, 5],
        "per_prompt_tested": [10, 8, 9],
        "per_prompt_drafted": [12, 12, 15],
        "per_prompt_seconds": [1.0, 1.0, 2.0],
        "per_prompt_target_only_seconds": [3.0, 1.0, 2.0],
        "per_prompt_quality": [1.0, float("nan"), 0.0],
        "speedup": 1.5,
    }


def test_an_empirical_cell_keeps_its_measured_figures_per_category() -> None:
    figures = category_figures(empirical_metrics(), LABELS, "empirical")
    assert set(figures) == {"a", "b"} and figures["b"]["prompts"] == 1  # the cell decoded 3 prompts
    assert figures["a"] == pytest.approx(
        {
            "block_efficiency": 20 / 8,
            "mean_acceptance_length": 1 + 12 / 8,
            "draft_acceptance": 12 / 24,
            "acceptance_rate": 12 / 18,
            "speedup": 4.0 / 2.0,
            "quality": 1.0,  # the prompt without a one-answer metric left out
            "prompts": 2,
        }
    )
    assert figures["b"]["speedup"] == pytest.approx(1.0) and figures["b"]["quality"] == 0.0
    # batched cells time whole batches: no per-category speedup
    batched = empirical_metrics() | {"per_prompt_seconds": [], "per_prompt_target_only_seconds": []}
    assert "speedup" not in category_figures(batched, LABELS, "empirical")["a"]
    assert category_figures(empirical_metrics(), LABELS[:2], "empirical") == {}  # more prompts than labels'
    kept = with_categories(record("bench", "empirical", empirical_metrics()), {"bench": LABELS})
    assert kept.metrics["prompt_categories"] == LABELS[:3]
    points = cell_metrics(kept)
    assert points["speedup/bench/tau_dec_1/category_a"] == pytest.approx(2.0)
    assert points["quality/bench/tau_dec_1/category_b"] == 0.0
    assert points["empirical_acceptance_rate/bench/tau_dec_1/category_a"] == pytest.approx(12 / 18)


def record(test_set: str, estimator: str, metrics: dict, draft: str = "d", tau: float = 1.0) -> CellRecord:
    return CellRecord(draft, "k", test_set, tau, estimator, 3, f"{draft}{tau}{test_set}", 0.1, 0.0, metrics)


def test_per_category_figures_reach_the_record_and_mlflow() -> None:
    metrics = analytic_metrics([10, 10, 8, 8, 8], [5, 5, 2, 2, 2], [6, 4, 7, 7, 7])
    kept = with_categories(record("bench", "analytic", metrics), {"bench": LABELS})
    assert set(kept.metrics[BY_CATEGORY]) == {"a", "b"} and kept.metrics["prompt_categories"] == LABELS
    points = cell_metrics(kept)
    assert points["acceptance_rate/bench/tau_dec_1/category_a"] == pytest.approx(0.5)
    assert points["speedup_model/bench/tau_dec_1/category_b"] == pytest.approx(8 / 2.6)
    untouched = record("in_domain", "analytic", metrics)
    assert with_categories(untouched, {"bench": LABELS}) is untouched  # a set without categories
    totals = record("bench", "empirical", {"speedup": 1.2})
    assert with_categories(totals, {"bench": LABELS}) is totals  # no per-prompt sums: totals only


def cells_frame(rows: list[CellRecord]) -> pd.DataFrame:
    frame = pd.DataFrame([r.flat() for r in rows])
    return frame.assign(paradigm="offline", tau_kd=None, recipe=frame.draft, replicate=0)


def test_workload_speedup_weighs_each_category_at_its_temperature() -> None:
    labels = ["a", "a", "b", "b"]
    fast = analytic_metrics([10, 10, 10, 10], [2, 2, 2, 2], [8, 8, 8, 8])  # E = 5 tokens per call
    slow = analytic_metrics([10, 10, 10, 10], [10, 10, 10, 10], [1, 1, 1, 1])  # E = 1
    rows = [
        with_categories(record("bench", "analytic", fast, tau=0.0), {"bench": labels}),
        with_categories(record("bench", "analytic", slow, tau=0.7), {"bench": labels}),
    ]
    table = prompt_cells(cells_frame(rows))["bench"]
    speed_fast, speed_slow = 10 / (2 + 0.6), 10 / (10 + 3.0)
    mix = report_categories.workload_of("bench", {"a": 0.0, "b": 0.7}, "share", labels)
    result = report_categories.workload_table(table, labels, mix)
    assert result.workload_speedup[0] == pytest.approx(0.5 * speed_fast + 0.5 * speed_slow, abs=1e-4)
    given = report_categories.workload_of("bench", {"a": 0.7, "b": 0.0}, {"a": 3.0, "b": 1.0}, labels)
    result = report_categories.workload_table(table, labels, given)
    assert result.workload_speedup[0] == pytest.approx(0.75 * speed_slow + 0.25 * speed_fast, abs=1e-4)
    # identical prompts within each category: no spread, so the interval is the point
    assert result.ci95[0] == f"[{result.workload_speedup[0]:.3f}, {result.workload_speedup[0]:.3f}]"


def test_the_workload_interval_draws_a_conversations_turns_together() -> None:
    # 12 two-turn conversations in one category, each conversation's turns alike (the second turn's prompt
    # holds the first's answer): resampled as 24 independent prompts the interval would be ~1/sqrt(2) wide
    rng = np.random.default_rng(1)
    per_conversation = rng.integers(5, 30, size=12)
    tokens = np.repeat(per_conversation, 2).tolist()
    calls = [10.0] * 24
    labels = ["a"] * 24
    conversations = [str(i // 2) for i in range(24)]
    metrics = analytic_metrics(tokens, calls, [t * 0.5 for t in tokens])
    row = with_categories(record("bench", "analytic", metrics), {"bench": labels}, {"bench": conversations})
    assert row.metrics["prompt_conversations"] == conversations
    table = prompt_cells(cells_frame([row]))["bench"]
    mix = report_categories.workload_of("bench", {"a": 1.0}, "share", labels)

    def width(owners: list[str] | None) -> float:
        low, high = map(
            float, report_categories.workload_table(table, labels, mix, owners).ci95[0][1:-1].split(",")
        )
        return high - low

    together, apart = width(conversations), width(None)
    assert together / apart == pytest.approx(np.sqrt(2), rel=0.15)
    assert report_categories.clusters(labels, conversations)["a"].shape == (12, 2)
    ragged = ["0", "0", "1"]  # conversations of different lengths: its prompts are drawn one by one
    assert report_categories.clusters(["a"] * 3, ragged)["a"].tolist() == [[0], [1], [2]]


def test_the_report_section_names_every_category_and_the_workload() -> None:
    rng = np.random.default_rng(0)
    labels = ["a"] * 6 + ["b"] * 6
    rows = []
    for tau in (0.0, 1.0):
        tokens = rng.integers(5, 20, size=12).tolist()
        calls = [t / 2.0 for t in tokens]
        beta = [t * 0.6 for t in tokens]
        rows.append(
            with_categories(
                record("bench", "analytic", analytic_metrics(tokens, calls, beta), tau=tau), {"bench": labels}
            )
        )
    workload = {"test_set": "bench", "temperatures": {"a": 0.0, "b": 1.0}, "weights": "share"}
    lines = "\n".join(report_categories.section(cells_frame(rows), workload))
    assert "## Per category: bench" in lines and "### Workload on bench" in lines
    assert "a τ=0 w=0.500, b τ=1 w=0.500" in lines
    assert report_categories.section(cells_frame(rows)[lambda f: f.test_set == "x"]) == []


# ---------------------------------------------------------------- the export's workload block


def plan_cell(draft: str, tau: float, gamma: int, speedups: dict[str, float]) -> CellRecord:
    """An analytic cell whose modelled speedup is the categories' mean, with per-category figures."""
    overall = sum(speedups.values()) / len(speedups)
    metrics = {
        "speedup_model": overall,
        "speedup_model_by_batch": {"1": overall},
        "speedup_model_by_batch_ci95": {"1": 0.01},
        BY_CATEGORY: {
            c: {"speedup_model": s, "prompts": 1.0 if c == "a" else 3.0} for c, s in speedups.items()
        },
    }
    return CellRecord(
        draft, draft, "bench", tau, "analytic", gamma, f"{draft}{tau}{gamma}", 0.1, 0.0, metrics
    )


def test_the_export_weighs_the_plans_route_at_each_categorys_temperature(tmp_path: Path) -> None:
    from specray.serving.plan import plan_batched
    from specray.serving.workload import workload_entry

    cells = [
        plan_cell("d1", 0.0, 3, {"a": 2.0, "b": 1.6}),  # d1 γ=3 wins τ 0
        plan_cell("d1", 0.0, 5, {"a": 1.5, "b": 1.5}),
        plan_cell("d2", 0.0, 3, {"a": 1.2, "b": 1.2}),
        plan_cell("d1", 1.0, 3, {"a": 0.9, "b": 0.7}),  # nothing clears 1 at τ 1: no speculation
        plan_cell("d2", 1.0, 3, {"a": 0.95, "b": 0.8}),
    ]
    spec = with_bench(
        tmp_path,
        ["writing", "math"],
        temperatures=[0.0, 1.0],
        workload={"test_set": "bench", "temperatures": {"writing": 1.0, "math": 0.0}},
    )
    cells = [replace_categories(c, {"a": "writing", "b": "math"}) for c in cells]
    entry = workload_entry(spec, cells, plan_batched(cells, "bench"))
    assert entry is not None
    by_category = {c["category"]: c for c in entry["categories"]}
    assert by_category["math"] | {"weight": 0} == {
        "category": "math",
        "temperature": 0.0,
        "weight": 0,
        "draft_key": "d1",
        "gamma": 3,
        "speedup_model": 1.6,
    }
    assert by_category["writing"]["gamma"] == 0 and by_category["writing"]["speedup_model"] == 1.0
    assert by_category["writing"]["weight"] == pytest.approx(0.25)  # its share of the prompts
    assert entry["plan_speedup"] == pytest.approx(0.25 * 1.0 + 0.75 * 1.6)
    # each draft alone at its best γ per category: d1 = 0.25·0.9 + 0.75·1.6, d2 = 0.25·0.95 + 0.75·1.2
    assert [d["draft"] for d in entry["drafts"]] == ["d1", "d2"]
    assert entry["drafts"][0]["workload_speedup"] == pytest.approx(0.25 * 0.9 + 0.75 * 1.6)
    assert workload_entry(SMOKE_SPEC, cells, plan_batched(cells, "bench")) is None


def replace_categories(cell: CellRecord, names: dict[str, str]) -> CellRecord:
    from dataclasses import replace

    figures = {names[c]: f for c, f in cell.metrics[BY_CATEGORY].items()}
    return replace(cell, metrics={**cell.metrics, BY_CATEGORY: figures})
