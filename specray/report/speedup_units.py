"""Speedup in the papers' units: wall-time speedup where it was measured, the model's elsewhere, labelled.

The papers report measured wall-time speedup. A sweep measures it only in its empirical cells (real
speculative decodes timed against target-only decodes); every other cell has the analytic estimate,
`speedup_model` from the exact expected counts at the measured step costs (`records.StepCosts.speedup`). One
heatmap per test set shows
the measured value where an empirical cell exists (outlined, marked "m") and the modelled one elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from specray.metrics import SPEEDUP, SPEEDUP_MODEL
from specray.names import BASELINE
from specray.report.best import best_gamma, best_rows  # noqa: E402
from specray.report.figures import colour_scale  # noqa: E402

MEASURED, MODELLED = "measured", "modelled"
UNITS_NOTE = (
    'Outlined cells marked "m": wall-time speedup measured by speculative decoding against target-only '
    "decoding (empirical cells, on `eval.empirical_prompts` prompts); the rest: `speedup_model` at the "
    "measured c (analytic, at each cell's best γ where several).\n"
)


def speedup_in_units(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per (draft, test set, τ_dec): `speedup` measured if an empirical cell has it, else the
    analytic `speedup_model`, each at its best γ; `source` says which. cells: `build.cells_frame` rows."""
    keys = ["draft", "test_set", "tau_dec"]
    modelled = best_gamma(cells)
    modelled = modelled.assign(shown=modelled[SPEEDUP_MODEL], source=MODELLED)
    measured = modelled.iloc[:0]
    if SPEEDUP in cells:
        empirical = cells[(cells.estimator == "empirical") & cells[SPEEDUP].notna()]
        chosen = [c for c in ("gamma", "batch_size") if c in empirical]
        measured = best_rows(empirical, SPEEDUP, keys, chosen).assign(
            shown=lambda f: f[SPEEDUP], source=MEASURED
        )
    both = pd.concat([measured, modelled]).drop_duplicates(keys, keep="first")  # measured wins
    return both[[*keys, "paradigm", "tau_kd", "shown", "source"]].reset_index(drop=True)


def _grid(rows: pd.DataFrame, paradigm: str, column: str) -> pd.DataFrame:
    """τ_kd × τ_dec of `column` for one paradigm, the un-distilled draft as the first row ("none")."""
    single = rows[(rows.paradigm == paradigm) & rows.tau_kd.notna()]
    grid = single.pivot_table(index="tau_kd", columns="tau_dec", values=column, aggfunc="first")
    base = rows[rows.draft == BASELINE].pivot_table(
        index="draft", columns="tau_dec", values=column, aggfunc="first"
    )
    return pd.concat([base.rename(index={BASELINE: "none"}), grid]) if not base.empty else grid


def _panel(ax: plt.Axes, rows: pd.DataFrame, paradigm: str) -> None:
    values = _grid(rows, paradigm, "shown")
    marks = _grid(rows.assign(measured=(rows.source == MEASURED).astype(float)), paradigm, "measured")
    marks = marks.reindex(index=values.index, columns=values.columns).fillna(0.0)
    scale = colour_scale(values.values, centred=True)  # every panel is a speedup: break-even at 1.0
    image = ax.imshow(values.values, aspect="auto", cmap=scale.cmap, norm=scale.norm)
    for (i, j), value in np.ndenumerate(values.values):
        if not np.isfinite(value):
            continue
        measured = marks.values[i, j] > 0
        label = f"{value:.2f}{'m' if measured else ''}"
        ax.text(j, i, label, ha="center", va="center", fontsize=7, color=scale.text(value))
        if measured:
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    ax.set_xticks(range(values.shape[1]), [f"{t:g}" for t in values.columns])
    ax.set_yticks(range(values.shape[0]), [i if isinstance(i, str) else f"{i:g}" for i in values.index])
    ax.set_xlabel("τ_dec (decoding)")
    ax.set_ylabel("τ_kd (KD data)")
    ax.set_title(paradigm)
    plt.colorbar(image, ax=ax, fraction=0.046)


def speedup_heatmaps(cells: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One figure per test set: measured speedup where empirical cells exist, modelled elsewhere."""
    shown = speedup_in_units(cells)
    paths = []
    for test_set, rows in shown.groupby("test_set"):
        paradigms = sorted(p for p in rows.paradigm.dropna().unique() if p != BASELINE) or [BASELINE]
        fig, axes = plt.subplots(1, len(paradigms), figsize=(5.5 * len(paradigms), 5), squeeze=False)
        for ax, paradigm in zip(axes[0], paradigms, strict=True):
            _panel(ax, rows, paradigm)
        fig.suptitle(
            f"speedup: measured (m, outlined) where empirical cells exist, modelled elsewhere ({test_set})"
        )
        path = out_dir / f"heatmap_speedup_measured_or_modelled_{test_set}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
