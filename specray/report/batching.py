"""The report's speedup-model sections: how the model agrees with measured wall time, and what it says as
the batch grows.

Agreement. For every empirical cell, the model's speedup from that cell's own counts (its block efficiency,
drafts per step and tokens per decode, `StepCosts.speedup`) at its batch size, next to the wall-time speedup
it measured: the ratio says how far the model is from this machine's decoders.

Batch sizes. With several `eval.batch_sizes`, per test set and τ_dec: the best draft's speedup against B
(a curve per γ), the best γ at each B, and the break-even batch size — the largest B at which the best
(draft, γ) still has the lower end of its speedup's 95% interval above 1.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from specray.metrics import (
    BLOCK_EFFICIENCY,
    DRAFTED_PER_STEP,
    SPEEDUP,
    SPEEDUP_CI95,
    SPEEDUP_MODEL,
    SPEEDUP_MODEL_BY_BATCH,
    TOKENS_PER_DECODE,
)
from specray.report.best import best_rows  # noqa: E402
from specray.report.tables import markdown_table  # noqa: E402
from specray.specdec.records import StepCosts  # noqa: E402

MODEL_NOTE = (
    "Each empirical cell's measured wall-time speedup next to the speedup the cost model gives from the same "
    "cell's block efficiency, drafts per step and tokens per decode (`speedup_model` of that cell's counts, "
    "prefills included, at its batch size). A ratio near 1 means the step costs describe this machine's "
    "decoders; the cost model is only as good as its timings (measure them where you serve). At B > 1 an "
    "empirical cell decodes static batches (a row that finishes leaves the batch) where the model describes "
    "a full one, as a continuous-batching server keeps it: the batch's tail shows as a ratio below 1.\n"
)
BATCH_NOTE = (
    "Modelled speedup at each batch size B of `eval.batch_sizes`: the same per-row acceptance, at the step "
    "costs timed at B. Rows of a batch are independent, so a row's expected tokens per step does not change "
    "with B; what changes is the cost of a step: the verification pass does B·(γ+1) tokens of work. The "
    "break-even B is the largest B at which the best (draft, γ) still has the lower end of its 95% "
    "interval above 1: beyond it, turn speculation off.\n"
)


def modelled_vs_measured(frame: pd.DataFrame, costs: StepCosts | None) -> pd.DataFrame:
    """Per empirical cell: measured speedup, the model's from the same cell's counts, and their ratio."""
    needed = {BLOCK_EFFICIENCY, DRAFTED_PER_STEP, TOKENS_PER_DECODE, SPEEDUP}
    if costs is None or frame.empty or not needed <= set(frame):
        return pd.DataFrame()
    cells = frame[(frame.estimator == "empirical") & frame.drafted_per_step.notna()]
    if "epsilon" in cells:
        cells = cells[cells.epsilon == 1.0]
    rows = []
    for cell in cells.itertuples():
        batch = int(getattr(cell, "batch_size", 1) or 1)
        if batch not in costs.draft or not math.isfinite(cell.block_efficiency):
            continue
        model = costs.speedup(
            cell.block_efficiency, int(cell.gamma), batch, cell.drafted_per_step, cell.tokens_per_decode
        )
        rows.append(
            {
                "draft": cell.draft,
                "test_set": cell.test_set,
                "tau_dec": cell.tau_dec,
                "gamma": int(cell.gamma),
                "B": batch,
                BLOCK_EFFICIENCY: cell.block_efficiency,
                "measured": cell.speedup,
                "measured_ci95": getattr(cell, SPEEDUP_CI95, math.nan),
                "modelled": model,
                "measured / modelled": cell.speedup / model,
            }
        )
    return pd.DataFrame(rows)


def agreement_lines(table: pd.DataFrame) -> list[str]:
    if table.empty:
        return ["No empirical cells with step counts (or no measured step costs): nothing to compare.\n"]
    ratio = table["measured / modelled"]
    inside = (ratio >= 0.9) & (ratio <= 1.1)
    # a cell outside [0.9, 1.1] whose own 95% interval holds the model: its few decodes cannot tell them apart
    covered = ~inside & ((table["measured"] - table["modelled"]).abs() <= table["measured_ci95"])
    missed = table[~inside & ~covered]
    lines = [
        f"measured / modelled over {len(table)} empirical cells: median {ratio.median():.3f}, range "
        f"{ratio.min():.3f}–{ratio.max():.3f}; {int(inside.sum())} of {len(table)} within [0.9, 1.1], "
        f"{int(covered.sum())} more whose measured 95% interval holds the modelled speedup, "
        f"{len(missed)} neither.\n"
    ]
    for cell in missed.itertuples():
        lines.append(
            f"- neither: {cell.draft} on {cell.test_set} at τ_dec {cell.tau_dec:g}, γ {cell.gamma}: measured "
            f"{cell.measured:.3f} ± {cell.measured_ci95:.3f}, modelled {cell.modelled:.3f}\n"
        )
    return lines


def batch_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Long form of the analytic cells' `speedup_model_by_batch`: one row per (cell, B) with its interval."""
    if frame.empty or SPEEDUP_MODEL_BY_BATCH not in frame:
        return pd.DataFrame()
    cells = frame[(frame.estimator == "analytic") & frame.speedup_model_by_batch.map(_is_dict)]
    if "epsilon" in cells:
        cells = cells[cells.epsilon == 1.0]
    rows = []
    for cell in cells.itertuples():
        for b, value in cell.speedup_model_by_batch.items():
            half = cell.speedup_model_by_batch_ci95.get(b, math.nan)
            rows.append(
                {
                    "draft": cell.draft,
                    "test_set": cell.test_set,
                    "tau_dec": cell.tau_dec,
                    "gamma": int(cell.gamma),
                    "B": int(b),
                    SPEEDUP: value,
                    "low": value - half,
                }
            )
    return pd.DataFrame(rows)


def best_per_batch(batches: pd.DataFrame) -> pd.DataFrame:
    """Per (test set, τ_dec, B): the (draft, γ) with the highest modelled speedup, and its interval."""
    if batches.empty:
        return batches
    return best_rows(batches, SPEEDUP, ("test_set", "tau_dec", "B"), ("draft", "gamma"))


def break_even(best: pd.DataFrame) -> pd.DataFrame:
    """Per (test set, τ_dec): the largest B whose best (draft, γ) has a lower 95% bound above 1 (0: none)."""
    rows = []
    for (test_set, tau), group in best.groupby(["test_set", "tau_dec"]):
        winning = group[group.low > 1.0].B
        largest = group.B.max()
        rows.append(
            {
                "test_set": test_set,
                "tau_dec": tau,
                "break-even B": int(winning.max()) if not winning.empty else 0,
                "largest B modelled": int(largest),
            }
        )
    return pd.DataFrame(rows)


def batch_curves(batches: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Per test set: a panel per τ_dec, the best draft at the smallest B, its speedup against B per γ."""
    paths = []
    for test_set, rows in batches.groupby("test_set"):
        taus = sorted(rows.tau_dec.unique())
        fig, axes = plt.subplots(1, len(taus), figsize=(3.2 * len(taus), 3.0), squeeze=False, sharey=True)
        smallest = rows.B.min()
        for ax, tau in zip(axes[0], taus, strict=True):
            here = rows[rows.tau_dec == tau]
            first = here[smallest == here.B]
            draft = best_rows(first, SPEEDUP, ("tau_dec",), ("draft", "gamma")).draft.iloc[0]
            for gamma, line in here[here.draft == draft].groupby("gamma"):
                line = line.sort_values("B")
                ax.plot(line.B, line.speedup, marker="o", label=f"γ={gamma}")
                ax.fill_between(line.B, line.low, 2 * line.speedup - line.low, alpha=0.15)
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_title(f"τ_dec={tau:g}\n{draft}", fontsize=8)
            ax.set_xlabel("batch size B")
        axes[0][0].set_ylabel(SPEEDUP_MODEL)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"speedup_vs_batch_{test_set}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def section(frame: pd.DataFrame, costs: StepCosts | None, out_dir: Path) -> list[str]:
    """The report's Markdown lines: modelled vs measured per empirical cell, then the batch-size section
    when the sweep modelled several batch sizes."""
    table = modelled_vs_measured(frame, costs)
    lines = ["\n## Speedup model vs measured wall time (per empirical cell)\n", MODEL_NOTE]
    lines += agreement_lines(table)
    if not table.empty:
        lines += [markdown_table(table)]
    batches = batch_frame(frame)
    if batches.empty or batches.B.nunique() < 2:
        return lines
    best = best_per_batch(batches)
    lines += ["\n## Speedup against batch size\n", BATCH_NOTE]
    lines += [f"![{p.stem}]({p.name})" for p in batch_curves(batches, out_dir)]
    lines += ["", "Best (draft, γ) per τ_dec and B:\n", markdown_table(best)]
    lines += ["", "Break-even batch size:\n", markdown_table(break_even(best))]
    return lines


def _is_dict(value: object) -> bool:
    return isinstance(value, dict)
