"""The sweep report: figures, tables and a findings check, as PNG + Markdown (+ CSV) in one folder.

It reads typed records only (each cell as a `CellRecord`, each draft as a `Draft`, training curves, output
lengths), so `specray run` builds it from what it just measured and `specray report RUN_ID` builds the same
thing from what MLflow holds (`tracking.fetch`). The records become one frame in one place
(`cells_frame`); every figure and table reads that frame.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from specray.distill.curves import CurvePoint
from specray.draft import Draft
from specray.metrics import ACCEPTANCE_RATE, SPEEDUP_MODEL
from specray.names import BASELINE
from specray.report import (
    batching,
    categories,
    distillspec,
    distillspec_prompts,
    entropy,
    figures,
    lossy,
    tables,
)
from specray.report.best import best_gamma
from specray.report.composition import Composition
from specray.report.convergence import CONVERGENCE_NOTE, convergence_table, projected_heading
from specray.report.figures import DRAFT_COLUMNS
from specray.report.paired import prompt_cells
from specray.report.peaks import PROJECTED, findings, gamma_table, peak_table, projected
from specray.report.replicates import (
    first_replicate,
    replicate_count,
    replicate_means,
    replicate_spread,
    variance_table,
)
from specray.report.serving import SERVER_NOTE, server_table
from specray.report.speedup_units import UNITS_NOTE, speedup_heatmaps
from specray.report.table3 import tune_section
from specray.report.tables import markdown_table
from specray.report.verdicts import all_verdicts, verdict_frame
from specray.specdec.records import CellRecord, StepCosts


def cells_frame(
    cells: Sequence[CellRecord], drafts: Sequence[Draft], keep_lists: bool = False
) -> pd.DataFrame:
    """One row per cell: its coordinates and metrics (`CellRecord.flat`), joined with where its draft goes
    in the figures (`figures.draft_columns`); list fields (β per position, per-prompt sums) only with
    `keep_lists` (the verdicts' bootstrap needs them)."""
    frame = pd.DataFrame(
        [{k: v for k, v in c.flat().items() if keep_lists or not isinstance(v, list)} for c in cells]
    )
    if frame.empty:
        return frame
    placed = pd.DataFrame(
        [{"draft": d.name, **figures.draft_columns(d)} for d in drafts], columns=DRAFT_COLUMNS
    )
    frame = frame.drop(columns=[c for c in DRAFT_COLUMNS if c in frame and c != "draft"])
    frame = frame.merge(placed, on="draft", how="left")
    frame.loc[frame.draft == BASELINE, "paradigm"] = BASELINE
    return frame


def build_report(
    cells: Sequence[CellRecord],
    drafts: Sequence[Draft],
    curves: Mapping[str, Sequence[CurvePoint]],
    lengths: Mapping[str, Mapping[float, list[int]]],
    out_dir: Path,
    title: str = "specray sweep",
    step_costs: StepCosts | None = None,
    projected_cost_ratio: float | None = None,
    token_lengths: Mapping[str, Mapping[Any, Mapping[Any, int]]] | None = None,
    composition: Composition | None = None,
    workload: Mapping[str, Any] | None = None,
    models: str | None = None,
) -> Path:
    """Write every figure and table into `out_dir`; returns the Markdown report's path. `models`: a line
    naming the target and the draft the cells are of. `drafts`: every
    draft the cells name (the un-distilled one included); `token_lengths`:
    test set -> τ_dec -> characters -> generated tokens (Fig. 5; JSON's string keys accepted);
    `composition`: a finished `specray tune`'s results (Table 3 and its verdict); `workload`: the sweep's
    eval.workload ({test_set, temperatures: category -> τ, weights}) for the per-category section."""
    out_dir.mkdir(parents=True, exist_ok=True)
    replicated = cells_frame(cells, drafts)
    replicated.to_csv(out_dir / "cells.csv", index=False)  # every replicate's own rows
    means = replicate_means(replicated)  # every figure and table: the mean over replicates
    frame = lossless(means)  # the lossy cells and the ends have their own section (report/lossy.py)
    probe_curves = figures.curve_frame(curves, drafts)
    at_best = (
        pd.concat([best_gamma(frame), frame[frame.estimator != "analytic"]]) if not frame.empty else frame
    )
    cost_line = (
        f"Step costs: {step_costs.describe()}; every analytic cell's speedup_model uses them"
        if step_costs
        else "step costs: not recorded"
    )
    sections = [f"# {title}\n", *([f"{models}\n"] if models else []), f"{cost_line}\n"]
    with_lists = lossless(cells_frame(cells, drafts, keep_lists=True))
    sections += _verdict_section(with_lists, probe_curves, composition, at_best, out_dir)
    sections += _replicates_section(lossless(replicated), with_lists, at_best, out_dir)
    probe_curves = first_replicate(probe_curves)  # the curve figures draw replicate 0's training
    several = not frame.empty and frame.gamma.nunique() > 1
    for metric in (SPEEDUP_MODEL, ACCEPTANCE_RATE):
        sections += [f"## {metric}: τ_kd × τ_dec" + (" (at each cell's best γ)" if several else "") + "\n"]
        sections += [HEATMAP_NOTE]
        sections += [f"![{p.stem}]({p.name})" for p in figures.heatmaps(at_best, metric, out_dir)]
    if not frame.empty:
        sections += ["\n## speedup in the papers' units: measured where possible, modelled elsewhere\n"]
        sections += [UNITS_NOTE, *[f"![{p.stem}]({p.name})" for p in speedup_heatmaps(frame, out_dir)]]
    if several:
        sections += ["\n## Best γ per draft and τ_dec\n", GAMMA_NOTE, markdown_table(gamma_table(frame))]
    if projected_cost_ratio is not None and not frame.empty:
        sections += [f"\n## {projected_heading(projected_cost_ratio)}\n"]
        sections += [
            "Each cell's expected tokens per step (`block_efficiency_sampled`) in the papers' model at the "
            "given draft/target cost ratio: E / (c·γ + 1), verification as one target step (at its best γ).\n"
        ]
        sections += [
            f"![{p.stem}]({p.name})"
            for p in figures.heatmaps(projected(frame, projected_cost_ratio), PROJECTED, out_dir)
        ]
    sections += ["\n## Fig. 3: peak speedup per τ_dec (offline vs online)\n", FIG3_NOTE]
    sections += [f"![{p.stem}]({p.name})" for p in figures.peak_speedup(at_best, out_dir)]
    peaks = peak_table(frame)
    sections += ["", markdown_table(peaks[peaks.tau_dec <= 1.0])]
    sections += _table2_section(at_best, peaks)
    sections += _distillspec_section(frame, with_lists, means, probe_curves, out_dir)
    sections += categories.section(with_lists, workload)
    sections += entropy.section(with_lists)
    sections += ["## Table 3: composition of τ_kd (from `specray tune`)\n"]
    sections += tune_section(composition) if composition is not None else [NO_TUNE]
    sections += _figure5_section(token_lengths or {}, lengths, out_dir)
    sections += _figure6_section(probe_curves, out_dir)
    sections += [
        "\n## Convergence of the drafts\n",
        CONVERGENCE_NOTE,
        markdown_table(convergence_table(curves)),
    ]
    sections += lossy.section(means, out_dir, step_costs)
    sections += batching.section(frame, step_costs, out_dir)
    sections += [
        "\n## What servers report\n",
        SERVER_NOTE,
        markdown_table(server_table(with_lists)),
    ]

    sections += ["\n## Empirical vs analytic acceptance (on the same prompts)\n", AGREEMENT_NOTE]
    sections += [f"![{p.stem}]({p.name})" for p in figures.agreement(frame, out_dir)]
    sections += ["", markdown_table(figures.paired_estimates(frame).reset_index())]
    path = out_dir / "report.md"
    path.write_text("\n".join(sections) + "\n")
    return path


def lossless(frame: pd.DataFrame) -> pd.DataFrame:
    """The speculative cells at ε = 1."""
    if frame.empty:
        return frame
    return frame[(frame.estimator != "ends") & (frame.epsilon == 1.0)]


def _verdict_section(
    cells: pd.DataFrame,
    curves: pd.DataFrame,
    composition: Composition | None,
    at_best: pd.DataFrame,
    out_dir: Path,
) -> list[str]:
    """The verdict table, where the peaks lie, and Fig. 1. `cells` keeps the per-prompt lists."""
    lines = [
        "## Verdicts\n",
        VERDICT_NOTE,
        markdown_table(verdict_frame(all_verdicts(cells, curves, composition))),
    ]
    lines += ["## Where the peaks are\n", *[f"- {line}" for line in findings(at_best)], ""]
    lines += ["## Fig. 1: speedup and acceptance vs τ_dec\n", FIG1_NOTE]
    return lines + [f"![{p.stem}]({p.name})" for p in figures.against_tau_dec(at_best, out_dir)]


def _distillspec_section(
    frame: pd.DataFrame,
    with_lists: pd.DataFrame,
    means: pd.DataFrame,
    curves: pd.DataFrame,
    out_dir: Path,
) -> list[str]:
    """KD algorithm × divergence (DistillSpec), only where the sweep varies either. `means` keeps the
    `ends` records (draft-alone quality, Fig. 5a)."""
    if not distillspec.varies(frame):
        return []
    lines = ["\n## DistillSpec: KD algorithm × divergence\n", distillspec.NOTE]
    lines += [f"![{p.stem}]({p.name})" for p in distillspec.heatmaps(frame, out_dir)]
    lines += [f"![{p.stem}]({p.name})" for p in distillspec.acceptance_over_steps(curves, out_dir)]
    lines += ["", "Table D.1:\n", markdown_table(distillspec.table_d1(frame)), ""]
    pairs = distillspec_prompts.prompt_pairs(with_lists)
    lines += distillspec_prompts.figure_lines(frame, means, pairs, out_dir)
    lines += ["", distillspec.VERDICT_NOTE, distillspec_prompts.VERDICT_NOTE]
    per_prompt = prompt_cells(with_lists)
    verdicts = [*distillspec.verdicts(per_prompt), *distillspec_prompts.verdicts(per_prompt, pairs)]
    return lines + [markdown_table(verdict_frame(verdicts)), ""]


def _replicates_section(
    replicated: pd.DataFrame, with_lists: pd.DataFrame, at_best: pd.DataFrame, out_dir: Path
) -> list[str]:
    """With training replicates: how the headline's variance splits, and the spread heatmaps."""
    count = replicate_count(replicated)
    if count == 1:
        return []
    lines = ["## Training replicates\n", REPLICATES_NOTE.format(count=count)]
    lines += [markdown_table(variance_table(prompt_cells(with_lists)))]
    spread = replicate_spread(replicated, at_best)
    lines += ["", SPREAD_NOTE]
    return lines + [
        f"![{p.stem}]({p.name})" for p in figures.heatmaps(spread, f"{SPEEDUP_MODEL}_sd", out_dir)
    ]


def _figure6_section(curves: pd.DataFrame, out_dir: Path) -> list[str]:
    """Fig. 6 as the paper draws it (τ_dec 1, τ_kd 0 and 1), then the diagonal variant."""
    lines = ["\n## Fig. 6: acceptance vs KD steps\n", FIG6_NOTE]
    lines += [f"![{p.stem}]({p.name})" for p in figures.kd_step_curves(curves, out_dir)]
    return lines + [f"![{p.stem}]({p.name})" for p in figures.acceptance_vs_steps(curves, out_dir)]


def _table2_section(at_best: pd.DataFrame, peaks: pd.DataFrame) -> list[str]:
    """Table 2: speedup and acceptance at out-of-range τ_dec for every τ_kd, then the best per row."""
    lines = ["## Table 2: out-of-range τ_dec (> 1), every τ_kd\n", TABLE2_NOTE]
    for metric in (SPEEDUP_MODEL, ACCEPTANCE_RATE):
        lines += [f"**{metric}**\n", markdown_table(tables.table2(at_best, metric))]
    return [*lines, "**best (τ_kd, γ) per row**\n", markdown_table(peaks[peaks.tau_dec > 1.0])]


def _figure5_section(
    token_lengths: Mapping[str, Mapping[Any, Mapping[Any, int]]],
    lengths: Mapping[str, Mapping[float, list[int]]],
    out_dir: Path,
) -> list[str]:
    """Fig. 5 over the target's outputs at τ_dec ≤ 1 (beyond, sampling is close to uniform noise), and the
    output lengths per τ_dec beside it."""
    counts: dict[str, dict[int, int]] = {}
    for test_set, by_tau in token_lengths.items():
        for tau, by_width in by_tau.items():
            if float(tau) <= 1.0:
                here = counts.setdefault(test_set, {})
                for width, tokens in by_width.items():
                    here[int(width)] = here.get(int(width), 0) + int(tokens)
    lines = ["\n## Fig. 5: token lengths in characters, per test set\n", FIG5_NOTE]
    lines += [f"![{p.stem}]({p.name})" for p in figures.token_length_distribution(counts, out_dir)]
    lines += ["\nResponse lengths (tokens) of the same outputs per τ_dec:\n"]
    return lines + [f"![{p.stem}]({p.name})" for p in figures.length_distribution(dict(lengths), out_dir)]


VERDICT_NOTE = (
    "Each claim of the papers, judged on this sweep: the effect (defined in the last column; S is the "
    "modelled speedup, analytic estimator, each cell at its best γ, recomputed from per-prompt sums), its "
    "95% percentile-bootstrap interval over test prompts (2,000 resamples; every draft resampled on the "
    "same prompts, i.e. paired; a best τ_kd is re-chosen in every resample) and the verdict: reproduced "
    "(interval entirely on the claimed side of 0), not reproduced (entirely on the other side), "
    "inconclusive (it contains 0, or no interval could be computed: the reason is given), not testable on "
    "this sweep (what the grid lacks is given). Definitions: `specray/report/verdicts.py`. Each row is a "
    "separate 95% interval: among twenty rows where nothing is going on, one is expected to exclude 0 by "
    "chance. With one training replicate per draft (`distill.replicates: 1`) the intervals cover the test "
    "prompts only, and the replicates column says so: another training seed could move the verdict. With "
    "N replicates the effect is averaged over them and its interval adds the spread between replicates to "
    "the prompts' (a t interval with Satterthwaite's degrees of freedom, `specray/bootstrap.py`); "
    "the replicates column says how many replicates show the claimed sign on their own.\n"
)
REPLICATES_NOTE = (
    "Every distilled draft was trained {count} times (`distill.replicates`), replicate r with "
    "`distill.seed` + r; every figure and table above and below shows the mean over replicates. Per test "
    "set and paradigm: the standard deviation of a cell's modelled speedup (at its best γ) between "
    "replicates scored on the same prompts, and between resampled test prompts (bootstrap, per replicate), "
    "averaged over the paradigm's cells; the training share is the first variance over their sum.\n"
)
SPREAD_NOTE = (
    "Standard deviation of `speedup_model` between replicates, per cell at its best γ (the companion of "
    "the mean heatmaps; the un-distilled draft has no training and no spread).\n"
)
GAMMA_NOTE = "Modelled speedup (analytic) of each draft at every γ of the grid, and the best γ.\n"
HEATMAP_NOTE = (
    "Fig. 2 (in-domain) and Fig. 4 (out-of-domain): analytic (modelled) values per paradigm over τ_kd × "
    "τ_dec; the top row is the un-distilled draft.\n"
)
FIG1_NOTE = (
    "Modelled speedup (analytic, at each cell's best γ) and acceptance rate vs τ_dec for the un-distilled "
    "draft and, per paradigm, the draft distilled at the grid τ_kd nearest 0.2 (in-domain test set).\n"
)
FIG3_NOTE = (
    "The best τ_kd's modelled speedup (analytic) per τ_dec for each paradigm and the un-distilled draft; "
    "dashed, right axis: online / offline − 1, the relative gain of online KD.\n"
)
TABLE2_NOTE = (
    "Modelled speedup and acceptance (analytic, each cell at its best γ) at τ_dec beyond the KD range, one "
    "column per τ_kd of the grid: the curve over τ_kd reads along a row.\n"
)
NO_TUNE = (
    "_not available: run `specray tune` on a tune spec of this sweep (e.g. `sweeps/tune_tiny.yaml`), then "
    "`specray report RUN_ID --tune <output_dir>/<tune name>/tune`._\n"
)
FIG5_NOTE = (
    "How many characters the tokens the target generates on each test set have (a proxy for how hard they "
    "are to guess), over its sampled test outputs at every τ_dec ≤ 1, with the total tokens generated; "
    "a token's length is its decoded text without a word's leading space (whitespace-only tokens count "
    "their own characters), special tokens left out.\n"
)
FIG6_NOTE = (
    "The training probe's acceptance (analytic, on validation prompts) along KD steps: first at τ_dec = 1.0 "
    "for τ_kd 0 and 1 (the paper's Fig. 6), then at τ_dec = τ_kd for every τ_kd of the grid.\n"
)

AGREEMENT_NOTE = (
    "Each empirical cell decodes the first `eval.empirical_prompts` test prompts; the analytic estimate in "
    "this table is computed on exactly those prompts (same draft, test set, τ_dec and γ). They agree when "
    "their difference lies within the combined 95% interval, √(ci_analytic² + ci_empirical²).\n"
)
