"""Which prompts gain from distillation: the per-prompt view by the target's entropy tier (DistillSpec's
per-example analysis).

Each analytic cell keeps, per test prompt, the target's mean entropy of p_τ over its response
(`per_prompt_target_entropy`), its tokens and its expected target calls. A test set's prompts are put in
three tiers — the lower, middle and upper third of the target's entropy at the highest τ_dec ≤ 1 of the grid
(at τ = 0 every entropy is 0) — and, in each tier, every distilled draft's per-prompt block efficiency
(tokens / target calls, at the draft's best γ) is compared with the un-distilled draft's on the same prompts:
the mean gain and the share of prompts that gain. The tiers are fixed from the target alone, so every draft
is judged on the same prompts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specray.metrics import PER_PROMPT_TARGET_ENTROPY
from specray.names import BASELINE
from specray.report.paired import PromptCells, analytic_test_sets
from specray.report.tables import markdown_table

ENTROPY = PER_PROMPT_TARGET_ENTROPY
TIERS = ("low", "mid", "high")
NOTE = (
    "Per test prompt, the target's mean entropy of p_τ over its response sorts the prompts into three tiers "
    "(thirds, at the τ_dec named); each cell: a distilled draft's mean per-prompt block-efficiency gain over "
    "the un-distilled draft on that tier's prompts, and the share of those prompts that gain. Block "
    "efficiency per prompt = its tokens / its expected target calls, at each draft's best γ, mean over "
    "training replicates.\n"
)


def entropy_tiers(entropy: np.ndarray) -> np.ndarray:
    """Tier index (0 low, 1 mid, 2 high) of each prompt by thirds of `entropy`; ties stay together."""
    low, high = np.quantile(entropy, [1 / 3, 2 / 3])
    return np.where(entropy <= low, 0, np.where(entropy <= high, 1, 2))


def _recorded(value: object) -> bool:
    return isinstance(value, list) and len(value) > 0


def _tier_tau(rows: pd.DataFrame) -> float | None:
    """The highest τ_dec in (0, 1] with entropies recorded."""
    kept = rows[rows[ENTROPY].map(_recorded)]
    taus = sorted(t for t in kept.tau_dec.unique() if 0 < t <= 1)
    return float(taus[-1]) if taus else None


def _block_efficiency(table: PromptCells, row: int) -> np.ndarray:
    """[prompts]: each prompt's tokens / target calls, mean over the cell's replicates (0 calls: nan)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (table.tokens[row] / table.target_calls[row]).mean(axis=1)


def tier_table(table: PromptCells, tiers: np.ndarray, tau: float) -> pd.DataFrame:
    """Rows: each distilled draft at τ_dec `tau`; columns per tier: mean gain and share of prompts gaining."""
    base = table.row(BASELINE, tau)
    if base is None:
        return pd.DataFrame()
    reference = _block_efficiency(table, base)
    rows = []
    for draft in dict.fromkeys(table.cells.draft):
        at = table.row(draft, tau)
        if draft == BASELINE or at is None:
            continue
        gain = _block_efficiency(table, at) - reference
        row: dict[str, object] = {"draft": draft}
        for index, name in enumerate(TIERS):
            chosen = gain[(tiers == index) & np.isfinite(gain)]
            row[name] = f"{chosen.mean():+.3f} ({(chosen > 0).mean():.0%})" if len(chosen) else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def section(with_lists: pd.DataFrame) -> list[str]:
    """Markdown lines: per test set whose cells recorded the target's entropy, the tier table."""
    lines: list[str] = []
    for test_set, rows, cells in analytic_test_sets(with_lists, ENTROPY):
        tau = _tier_tau(rows)
        if tau is None:
            continue
        at_tau = rows[np.isclose(rows.tau_dec, tau) & rows[ENTROPY].map(_recorded)]
        entropy = np.asarray(at_tau[ENTROPY].iloc[0], dtype=float)
        tiers = entropy_tiers(entropy)
        table = tier_table(cells, tiers, tau)
        if table.empty:
            continue
        edges = np.quantile(entropy, [1 / 3, 2 / 3])
        lines += [f"\n## Which prompts gain: {test_set}, by the target's entropy at τ_dec {tau:g}\n", NOTE]
        lines += [
            f"Tier edges: {edges[0]:.3f} and {edges[1]:.3f} nats per token.\n",
            markdown_table(table),
            "",
        ]
    return lines
