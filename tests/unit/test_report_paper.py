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

from specray.distill.curves import CurvePoint
from specray.names import BASELINE
from specray.report.build import build_report
from specray.report.tables import load_composition, table2

TAUS_KD = (0.0, 0.5, 1.0)
TAUS_DEC = (0.0, 0.5, 1.0, 1.5, 2.0)
PROMPTS = 12


def _cell(draft: str, test_set: str, tau_dec: float, efficiency: float) -> dict:
    """An analytic cell record (CellRecord.flat()) whose prompts all have block efficiency ≈ `efficiency`."""
    rng = np.random.default_rng(zlib.crc32(f"{draft}|{test_set}|{tau_dec}".encode()))
    tokens = rng.integers(20, 40, PROMPTS).astype(float)
    calls = tokens / (efficiency + rng.normal(0, 0.05, PROMPTS))
    return {
        "draft": draft,
        "draft_key": "k",
        "test_set": test_set,
        "tau_dec": tau_dec,
        "estimator": "analytic",
        "gamma": 4,
        "key": f"{draft}|{test_set}|{tau_dec}",
        "c": 0.1,
        "seconds": 1.0,
        "acceptance_rate": 0.5,
        "speedup_model": float(tokens.sum() / calls.sum() / 1.4),
        "block_efficiency_simulated": float(tokens.sum() / calls.sum()),
        "per_prompt_tokens": tokens.tolist(),
        "per_prompt_beta_sum": (tokens * 0.5).tolist(),
        "per_prompt_target_calls": calls.tolist(),
    }


def _sweep() -> tuple[list[dict], dict[str, dict]]:
    """Both paradigms, τ_kd 0/0.5/1 and the un-distilled draft on both test sets at every τ_dec."""
    drafts = {BASELINE: {"paradigm": None, "tau_kd": None}}
    drafts |= {
        f"{p}/tau_kd={k:g}": {"paradigm": p, "tau_kd": k} for p in ("offline", "online") for k in TAUS_KD
    }
    cells = []
    for name, info in drafts.items():
        for test_set in ("in_domain", "out_of_domain"):
            for tau_dec in TAUS_DEC:
                match = 0.0 if info["tau_kd"] is None else 1.0 - abs(info["tau_kd"] - min(tau_dec, 1.0))
                cells.append(_cell(name, test_set, tau_dec, 1.5 + match - 0.2 * tau_dec))
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
    (report / "cells.json").write_text(json.dumps(cells))
    return folder


def _curves(drafts: dict[str, dict]) -> dict[str, list[CurvePoint]]:
    return {
        name: [
            CurvePoint(step, loss=1.0, acceptance={1.0: 0.4 + step / 1000 * (1 + info["tau_kd"])})
            for step in (0, 50, 100)
        ]
        for name, info in drafts.items()
        if info["tau_kd"] is not None
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
    cells, drafts = _sweep()
    frame = pd.DataFrame(cells).merge(
        pd.DataFrame([{"draft": n, **d} for n, d in drafts.items()]), on="draft"
    )
    table = table2(frame)
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
