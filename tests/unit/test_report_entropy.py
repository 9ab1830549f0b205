"""The per-prompt view by the target's entropy tier: tiers by thirds, and each tier's gain over the
un-distilled draft on the same prompts."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specray.names import BASELINE
from specray.report.entropy import entropy_tiers, section, tier_table
from specray.report.paired import prompt_cells

TERMS = {"target_step": 1.0, "per_drafted_token": 0.1}


def cell(draft: str, tau: float, calls: list[float], entropy: list[float]) -> dict:
    tokens = [12] * len(calls)
    return {
        "draft": draft,
        "recipe": draft,
        "replicate": 0,
        "paradigm": "offline",
        "tau_kd": None,
        "test_set": "in_domain",
        "tau_dec": tau,
        "estimator": "analytic",
        "gamma": 3,
        "epsilon": 1.0,
        "speedup_model": 1.0,
        "c": 0.1,
        "cost_terms": TERMS,
        "per_prompt_tokens": tokens,
        "per_prompt_beta_sum": [6.0] * len(calls),
        "per_prompt_target_calls": calls,
        "per_prompt_drafted": [3.0 * c for c in calls],
        "per_prompt_target_entropy": entropy,
    }


ENTROPY = [0.1, 0.2, 1.0, 1.1, 3.0, 3.5]  # two prompts per tier


def test_tiers_are_thirds_of_the_targets_entropy() -> None:
    assert entropy_tiers(np.array(ENTROPY)).tolist() == [0, 0, 1, 1, 2, 2]
    assert entropy_tiers(np.zeros(6)).tolist() == [0] * 6  # τ = 0: one tier


def test_each_tier_compares_the_same_prompts_with_the_un_distilled_draft() -> None:
    base = [6.0, 6.0, 6.0, 6.0, 6.0, 6.0]  # block efficiency 2 everywhere
    # the distilled draft gains on the low tier (12/4 = 3), on one mid prompt, and loses on the high tier
    distilled = [4.0, 4.0, 4.0, 6.0, 8.0, 8.0]
    frame = pd.DataFrame(
        [cell(BASELINE, 1.0, base, ENTROPY), cell("offline/tau_kd=1", 1.0, distilled, ENTROPY)]
    )
    table = tier_table(prompt_cells(frame)["in_domain"], entropy_tiers(np.array(ENTROPY)), 1.0)
    row = table.iloc[0]
    assert row.draft == "offline/tau_kd=1"
    assert row.low == "+1.000 (100%)" and row.mid == "+0.500 (50%)" and row.high == "-0.500 (0%)"


def test_the_section_picks_the_highest_tau_dec_up_to_one_with_entropy() -> None:
    rows = [cell(BASELINE, tau, [6.0] * 6, [0.0] * 6 if tau == 0 else ENTROPY) for tau in (0.0, 0.6, 1.5)] + [
        cell("offline/tau_kd=1", tau, [4.0] * 6, [0.0] * 6 if tau == 0 else ENTROPY)
        for tau in (0.0, 0.6, 1.5)
    ]
    text = "\n".join(section(pd.DataFrame(rows)))
    assert "by the target's entropy at τ_dec 0.6" in text
    assert "+1.000 (100%)" in text
    old = pd.DataFrame(rows).drop(columns=["per_prompt_target_entropy"])  # records of older runs
    assert section(old) == []
