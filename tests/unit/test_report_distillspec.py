"""The report's DistillSpec section: shown only when a sweep varies divergence or data source; its
algorithm × divergence heatmaps, Table D.1, and the two verdicts on planted effects."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from specray.names import BASELINE
from specray.report import distillspec, paired
from tests.unit.test_verdicts import DIFFICULTY, cell

SOURCES = ("supervised_kd", "seqkd", "imitkd", "f_distill", "gkd")
DIVERGENCES = ("fkl", "tvd")


def grid(bonus: dict[str, float]) -> pd.DataFrame:
    """Online drafts at τ_kd 1 per (data source, divergence) at τ_dec 0 and 1, each `bonus[source]` better
    in block efficiency than the un-distilled draft on every prompt; plus the un-distilled draft."""
    rows = [cell(BASELINE, tau, DIFFICULTY) for tau in (0.0, 1.0)]
    for source in SOURCES:
        for divergence in DIVERGENCES:
            name = f"online/tau_kd=1/{divergence}/{source}"
            info = {"paradigm": "online", "tau_kd": 1.0}
            for tau in (0.0, 1.0):
                row = cell(name, tau, DIFFICULTY + bonus[source], **info)
                row |= {"divergence": divergence, "data_source": source, "recipe": name, "replicate": 0}
                row["block_efficiency_sampled"] = row["speedup_model"]
                rows.append(row)
    rows[0]["block_efficiency_sampled"] = rows[0]["speedup_model"]
    rows[1]["block_efficiency_sampled"] = rows[1]["speedup_model"]
    return pd.DataFrame(rows)


def by_claim(frame: pd.DataFrame) -> dict[str, paired.Verdict]:
    return {v.claim: v for v in distillspec.verdicts(paired.prompt_cells(frame))}


def test_generated_data_and_gkd_near_the_best_are_reproduced_where_planted() -> None:
    found = by_claim(grid({"supervised_kd": 0.0, "seqkd": 0.3, "imitkd": 0.2, "f_distill": 0.3, "gkd": 0.4}))
    assert found[distillspec.GENERATED_BEATS_FIXED].verdict == paired.REPRODUCED
    assert found[distillspec.GENERATED_BEATS_FIXED].effect > 0
    assert found[distillspec.GKD_NEAR_BEST].verdict == paired.REPRODUCED


def test_ground_truth_winning_and_gkd_far_behind_are_not_reproduced() -> None:
    found = by_claim(grid({"supervised_kd": 0.5, "seqkd": 0.0, "imitkd": 0.2, "f_distill": 0.0, "gkd": 0.0}))
    assert found[distillspec.GENERATED_BEATS_FIXED].verdict == paired.NOT_REPRODUCED
    assert found[distillspec.GKD_NEAR_BEST].verdict == paired.NOT_REPRODUCED


def test_without_supervised_kd_the_claim_is_not_testable() -> None:
    frame = grid(dict.fromkeys(SOURCES, 0.1))
    found = by_claim(frame[frame.data_source.fillna("") != "supervised_kd"])
    assert found[distillspec.GENERATED_BEATS_FIXED].verdict == paired.NOT_TESTABLE


def test_table_d1_names_the_algorithms_and_the_section_shows_only_for_a_grid(tmp_path: Path) -> None:
    frame = grid(dict.fromkeys(SOURCES, 0.1))
    table = distillspec.table_d1(frame)
    assert set(table.algorithm) == {"(un-distilled)", "SupervisedKD", "SeqKD", "ImitKD", "f-Distill", "GKD"}
    assert len(table) == 2 * (1 + len(SOURCES) * len(DIVERGENCES))
    assert distillspec.varies(frame)
    one = frame[(frame.divergence.fillna("fkl") == "fkl") & frame.data_source.isin([np.nan, "gkd"])]
    assert not distillspec.varies(one)
    paths = distillspec.heatmaps(frame, tmp_path)
    assert [p.name for p in paths] == [
        "distillspec_block_efficiency_sampled_in_domain_tau_kd=1.png",
        "distillspec_speedup_model_in_domain_tau_kd=1.png",
    ]
    assert all(p.stat().st_size > 0 for p in paths)


def test_acceptance_over_kd_steps_has_a_panel_per_divergence(tmp_path: Path) -> None:
    from specray.distill.curves import CurvePoint
    from specray.draft import Draft
    from specray.report.figures import curve_frame

    drafts = [
        Draft(f"online/tau_kd=1/{d}/{s}", "online", {1.0: 1.0}, divergence=d, data_source=s)
        for d in DIVERGENCES
        for s in SOURCES
    ]
    points = [CurvePoint(step=step, loss=1.0, acceptance={1.0: 0.5 + step / 100}) for step in (0, 10, 20)]
    frame = curve_frame({d.name: points for d in drafts}, drafts)
    (path,) = distillspec.acceptance_over_steps(frame, tmp_path)
    assert path.name == "distillspec_kd_steps_tau_kd=1.png" and path.stat().st_size > 0
    assert distillspec.acceptance_over_steps(frame.iloc[0:0], tmp_path) == []
