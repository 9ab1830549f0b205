"""The sweep report has the papers' figures and tables and the verdict table, built from constructed records
(the shapes `specray run` and `specray tune` write), including the parts the smoke grid cannot show:
out-of-range τ_dec (Table 2 with every τ_kd) and a finished tune (Table 3 and the composition verdict)."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specray.distill.curves import CurvePoint
from specray.draft import Draft
from specray.names import BASELINE
from specray.report.build import build_report, cells_frame
from specray.report.tables import load_composition, table2
from specray.specdec.records import CellRecord
from tests.stores import new_store

TAUS_KD = (0.0, 0.5, 1.0)
TAUS_DEC = (0.0, 0.5, 1.0, 1.5, 2.0)
PROMPTS = 12


def _cell(draft: str, test_set: str, tau_dec: float, efficiency: float) -> CellRecord:
    """An analytic cell record whose prompts all have block efficiency ≈ `efficiency`."""
    rng = np.random.default_rng(zlib.crc32(f"{draft}|{test_set}|{tau_dec}".encode()))
    tokens = rng.integers(20, 40, PROMPTS).astype(float)
    calls = tokens / (efficiency + rng.normal(0, 0.05, PROMPTS))
    metrics = {
        "acceptance_rate": 0.5,
        "speedup_model": float(tokens.sum() / calls.sum() / 1.4),
        "block_efficiency_simulated": float(tokens.sum() / calls.sum()),
        "per_prompt_tokens": tokens.tolist(),
        "per_prompt_beta_sum": (tokens * 0.5).tolist(),
        "per_prompt_target_calls": calls.tolist(),
    }
    key = f"{draft}|{test_set}|{tau_dec}"
    return CellRecord(draft, "k", test_set, tau_dec, "analytic", 4, key, 0.1, 1.0, metrics)


def _sweep() -> tuple[list[CellRecord], list[Draft]]:
    """Both paradigms, τ_kd 0/0.5/1 and the un-distilled draft on both test sets at every τ_dec."""
    drafts = [Draft(BASELINE, None, {})]
    drafts += [Draft(f"{p}/tau_kd={k:g}", p, {k: 1.0}) for p in ("offline", "online") for k in TAUS_KD]
    cells = []
    for draft in drafts:
        for test_set in ("in_domain", "out_of_domain"):
            for tau_dec in TAUS_DEC:
                tau_kd = draft.tau_kd
                match = 0.0 if tau_kd is None else 1.0 - abs(tau_kd - min(tau_dec, 1.0))
                cells.append(_cell(draft.name, test_set, tau_dec, 1.5 + match - 0.2 * tau_dec))
    return cells, drafts


def _tune_folder(folder: Path) -> Path:
    """What `specray tune` leaves in <output>/<name>/tune/report: table3.csv and cells.json."""
    report = folder / "report"
    report.mkdir(parents=True)
    rows, cells = [], []
    for test_set in ("in_domain", "out_of_domain"):
        for tau_dec in (0.8, 1.0):
            names = {
                "single draft": "offline/tau_kd=1",
                "manual draft": "offline/mix",
                "tuned draft": "tuned:x",
            }
            for name, gain in zip(names.values(), (1.0, 1.15, 1.2), strict=True):
                cells.append(_cell(name, test_set, tau_dec, 2.0 * gain))
            rows.append(
                {"test_set": test_set, "tau_dec": tau_dec, "single tau_kd": "1", "manual recipe": "0.9+1"}
                | {"single acceptance_rate": 0.6, "single speedup_model": 1.4, "manual speedup_model": 1.6}
                | {"manual acceptance_rate": 0.65, "manual gain": 0.15, "tuned acceptance_rate": 0.7}
                | {"tuned speedup_model": 1.7, "tuned gain": 0.2}
                | names
            )
    pd.DataFrame(rows).to_csv(report / "table3.csv", index=False)
    (report / "cells.json").write_text(json.dumps([c.flat() for c in cells]))
    return folder


def _curves(drafts: list[Draft]) -> dict[str, list[CurvePoint]]:
    return {
        d.name: [
            CurvePoint(step, loss=1.0, acceptance={1.0: 0.4 + step / 1000 * (1 + d.tau_kd)})
            for step in (0, 50, 100)
        ]
        for d in drafts
        if d.tau_kd is not None
    }


def test_the_report_has_every_paper_figure_table_and_the_verdicts(tmp_path: Path) -> None:
    cells, drafts = _sweep()
    lengths = {"in_domain": {0.0: [10, 12]}, "out_of_domain": {0.0: [9]}}
    token_lengths = {
        "in_domain": {"0.0": {"1": 30, "3": 10}, "2.0": {"9": 99}},
        "out_of_domain": {"0.0": {"2": 5}},
    }
    path = build_report(
        cells,
        drafts,
        _curves(drafts),
        lengths,
        tmp_path / "report",
        token_lengths=token_lengths,
        composition=load_composition(_tune_folder(tmp_path / "tune")),
    )
    report = path.read_text()
    for heading in (
        "## Verdicts",
        "## Fig. 1",
        "## Fig. 3",
        "## Table 2",
        "## Table 3",
        "## Fig. 5",
        "## Fig. 6",
    ):
        assert heading in report, heading
    for figure in (
        "fig1_against_tau_dec",
        "peak_speedup_model_in_domain",
        "fig5_token_lengths",
        "fig6_kd_steps",
    ):
        assert (path.parent / f"{figure}.png").exists() and f"({figure}.png)" in report, figure
    assert "heatmap_speedup_model_out_of_domain.png" in report
    verdict_rows = [line for line in report.splitlines() if "| composition gains" in line]
    assert len(verdict_rows) == 4  # manual and tuned, on both test sets, each with an interval
    assert all("| [" in row for row in verdict_rows)
    for claim in ("speedup falls", "diagonal", "higher neighbour", "KD helps most", "online beats offline"):
        assert f"| {claim}" in report or f"| the {claim}" in report or f"| a {claim}" in report, claim
    assert "U-curve" in report and "out-of-domain speedup is larger" in report
    table = report.split("## Verdicts", 1)[1].split("## Where", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert all(len(re.findall(r"(?<!\\)\|", row)) == 8 for row in rows)  # 7 cells: no stray "|"
    table3_rows = [
        line for line in report.splitlines() if line.startswith(("| in_domain | 1", "| out_of_domain | 1"))
    ]
    assert table3_rows, "Table 3 lists both test sets"


def test_table2_has_a_column_per_tau_kd_for_both_out_of_range_tau_dec_and_paradigms() -> None:
    table = table2(cells_frame(*_sweep()))
    assert [f"τ_kd={k:g}" for k in TAUS_KD] == [c for c in table.columns if c.startswith("τ_kd=")]
    assert set(zip(table.paradigm, table.tau_dec, strict=True)) == {
        (p, t) for p in ("offline", "online") for t in (1.5, 2.0)
    }
    assert table["un-distilled"].notna().all() and table.test_set.nunique() == 2


class _Tokenizer:
    """Byte-level BPE's shapes: a word with its leading space, a newline, a bare piece, and EOS (id 0)."""

    all_special_ids = (0,)
    pieces = {1: " the", 2: "\n", 3: "ab"}

    def decode(self, ids: list[int]) -> str:
        return self.pieces[ids[0]]


def test_token_characters_counts_generated_tokens_by_their_length() -> None:
    from specray.sweep.run import token_characters

    outputs = {"in_domain": {0.5: [[1, 2, 0], [3, 1]]}}
    # " the" -> 3 (leading space not counted) twice, "\n" -> 1 (whitespace counts itself), "ab" -> 2, EOS out
    assert token_characters(outputs, _Tokenizer()) == {"in_domain": {0.5: {3: 2, 1: 1, 2: 1}}}


def _old_form(cells: list[CellRecord], drafts: list[Draft]) -> dict[str, object]:
    """`records/cells.json` and `drafts.json` as a sweep logged them before the report read typed records:
    each cell's flat report row, each draft's description by name (its mixture as a tag)."""
    described = {
        d.name: {
            "paradigm": d.paradigm,
            "tau_kd": d.tau_kd,
            "mixture": ",".join(f"{t:g}:1" for t in d.mixture),
        }
        | {"divergence": "", "data_source": "", "recipe": d.recipe, "replicate": d.replicate}
        for d in drafts
    }
    return {"cells": [c.flat() for c in cells], "drafts": described}


def test_a_report_is_rebuilt_from_the_records_of_a_sweep_and_an_older_format_is_refused(
    tmp_path: Path,
) -> None:
    """What `specray report RUN_ID` does: the parent run's records read back (`fetch_sweep_records`) as typed
    records give the report the sweep wrote; records of an older format are refused in one line."""
    from mlflow.tracking import MlflowClient

    from specray.errors import SpecError
    from specray.tracking.fetch import fetch_sweep_records
    from specray.tracking.names import ROLE

    cells, drafts = _sweep()
    new_form = {"cells": [c.to_json() for c in cells], "drafts": [d.to_json() for d in drafts]}
    client = MlflowClient(tracking_uri=new_store(tmp_path))
    experiment = client.create_experiment("rebuild", artifact_location=(tmp_path / "artifacts").as_uri())
    runs = {}
    for form, records in (("new", new_form), ("old", _old_form(cells, drafts))):
        runs[form] = client.create_run(experiment, tags={ROLE: "sweep"}).info.run_id
        for name, payload in records.items():
            client.log_dict(runs[form], payload, f"records/{name}.json")
    fetched = fetch_sweep_records(client.tracking_uri, runs["new"], tmp_path / "new")
    assert fetched["cells"] == cells
    assert [(d.name, d.paradigm, dict(d.mixture), d.recipe) for d in fetched["drafts"]] == [
        (d.name, d.paradigm, dict(d.mixture), d.recipe) for d in drafts
    ]
    path = build_report(fetched["cells"], fetched["drafts"], {}, {}, tmp_path / "new" / "report")
    direct = build_report(cells, drafts, {}, {}, tmp_path / "direct").read_text()
    assert path.read_text() == direct
    with pytest.raises(SpecError, match=f"run {runs['old']}: written by an older specray format"):
        fetch_sweep_records(client.tracking_uri, runs["old"], tmp_path / "old")


def test_the_server_table_reads_the_fastest_analytic_cell_and_its_empirical_twin_over_replicates() -> None:
    """The fastest (draft, γ) by speedup averaged over replicates, not the luckiest replicate; its server
    metrics and its empirical twin's are the replicates' means."""
    from dataclasses import replace

    from specray.report.serving import server_table

    expected = {"speedup_model": 2.0, "mean_acceptance_length": 3.0, "draft_acceptance": 0.5}
    steady = CellRecord("d1", "k", "in_domain", 0.5, "analytic", 4, "a", 0.1, 1.0, expected)
    steady.metrics["acceptance_per_position"] = [0.9, float("nan")]
    again = replace(steady, draft="d1/r1", key="a1", metrics={**expected, "mean_acceptance_length": 3.2})
    lucky = replace(steady, draft="d2", key="b", metrics={**expected, "speedup_model": 2.5})
    unlucky = replace(lucky, draft="d2/r1", key="b1", metrics={**expected, "speedup_model": 1.0})
    counted = {"mean_acceptance_length": 2.9, "draft_acceptance": 0.48, "acceptance_per_position": [0.88]}
    twin = CellRecord("d1", "k", "in_domain", 0.5, "empirical", 4, "e", None, 1.0, counted)
    other = replace(twin, test_set="out_of_domain", key="f")
    drafts = [Draft(n, "online", {0.5: 1.0}, replicate=r) for n, r in (("d1", 0), ("d1/r1", 1), ("d2", 0))]
    drafts.append(Draft("d2/r1", "online", {0.5: 1.0}, replicate=1))
    frame = cells_frame([lucky, unlucky, steady, again, twin, other], drafts, keep_lists=True)
    (row,) = server_table(frame).to_dict("records")
    assert (row["draft"], row["mean_acceptance_length"], row["per position"]) == ("d1", 3.1, "0.90 -")
    assert (row["empirical draft_acceptance"], row["empirical per position"]) == (0.48, "0.88")
    assert server_table(cells_frame([replace(steady, metrics={"speedup_model": 2.0})], drafts)).empty
