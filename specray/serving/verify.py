"""`specray export --verify`: the plan checked by a real client, transformers' assisted generation.

For every band routed to a draft, the exported draft assists the target at the band's binding τ_dec with
γ tokens per step on the sweep's held-out test prompts (the population the plan's figures were measured
on), one decode per prompt. The harness is `specdec/hf_compare.py` (shared with the benchmarks): the draft
is configured the way transformers 5.x reads it, every decode is traced (each verification step's drafted
tokens and HF's own `n_matches`), and nothing is measured unless the configuration took effect — every step
drafted γ tokens (fewer only at the length limit or after a drafted EOS), the logits processors are exactly
one temperature warper on each side, and the draft's scores are its logits / τ.

Measured, in HF's counting: draft acceptance = Σ accepted / Σ drafted over all steps, and mean acceptance
length = 1 + Σ accepted / Σ steps, with 95% intervals (prompts as clusters, delta method). The plan's
prediction in the same counting is `draft_acceptance_hf` (ops/blocks.py: HF does not count an accepted
EOS that ends the decode). Wall-time speedup: each prompt is decoded again untraced (its tokens must equal
the traced ones: same seed, same work) and by the target alone to the same length with the same seed;
speedup = Σ target-only seconds / Σ assisted seconds, with its 95% interval. The check passes when the
plan's predicted draft acceptance lies inside HF's measured 95% interval.

A band the plan declines (no speculation: its best candidate's speedup is not above `--min-speedup`) is a
prediction too — that speculating there would not pay. Where the sweep's drafts are at hand, that band's
best candidate is checked the same way (`route` "declined"), so a sweep whose every draft loses to the
target alone still has its plan held to measurements.

specray's own decoder runs on the same prompts (one decode each, timed against target-only decoding to the
same lengths: `specdec.empirical.run_empirical`): the plan's modelled speedup is the cost model's for that
decoder, so that is the measurement to hold it to (`ours_agrees`: within ±10%). HF's wall-time speedup is
lower by what HF spends per step beyond ours (its candidate generator, logits processors, stopping criteria
and cache bookkeeping): `hf_overhead_ms_per_step` is that difference, measured here.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel

from specray.metrics import (
    DRAFT_ACCEPTANCE,
    DRAFT_ACCEPTANCE_CI95,
    DRAFT_ACCEPTANCE_HF,
    MEAN_ACCEPTANCE_LENGTH,
    MEAN_ACCEPTANCE_LENGTH_CI95,
    MEAN_ACCEPTANCE_LENGTH_HF,
    SPEEDUP,
)
from specray.seeds import prompt_seed
from specray.specdec.analytic import ratio_ci95
from specray.specdec.empirical import run_empirical
from specray.specdec.hf_compare import (
    AssistedTrace,
    Comparison,
    MisconfiguredComparison,
    assisted_kwargs,
    check_assisted,
    check_draft_scores,
    configure_assistant,
    run_assisted,
    trace_assisted,
)

if TYPE_CHECKING:
    from specray.models.loading import CausalLM


@dataclass(frozen=True)
class BandCheck:
    """One band: what HF measured beside what the plan predicted."""

    alias: str
    tau_dec: float
    draft: str  # the exported draft's folder in the export (routed), or a declined band's candidate's name
    gamma: int
    prompts: int
    steps: int
    drafted: int
    accepted: int
    draft_acceptance: float  # HF's counting: accepted / drafted
    draft_acceptance_ci95: float
    predicted_draft_acceptance: float  # the plan's, converted to HF's counting
    predicted_draft_acceptance_ci95: float
    mean_acceptance_length: float
    mean_acceptance_length_ci95: float
    predicted_mean_acceptance_length: float  # the plan's, in HF's counting
    speedup: float  # wall time, target alone / assisted
    speedup_ci95: float
    predicted_speedup: float
    predicted_speedup_basis: str
    seconds: float
    ours_speedup: float = math.nan  # specray's decoder on the same prompts, target-only to the same lengths
    ours_speedup_ci95: float = math.nan
    hf_overhead_ms_per_step: float = math.nan  # HF's seconds per assisted step minus ours, in ms
    route: str = "speculative"  # or "declined": the band's best candidate, which the plan did not route

    @property
    def agrees(self) -> bool:
        """The prediction lies inside HF's measured 95% interval."""
        return abs(self.predicted_draft_acceptance - self.draft_acceptance) <= self.draft_acceptance_ci95

    @property
    def ours_agrees(self) -> bool:
        """The plan's speedup is within ±10% of what specray's own decoder measured."""
        return abs(self.predicted_speedup / self.ours_speedup - 1.0) <= 0.1


def traced_counts(traces: list[AssistedTrace]) -> dict[str, float]:
    """Steps, drafted and accepted (HF's n_matches) summed, and their ratios with 95% intervals."""
    per = torch.tensor(
        [(sum(s.accepted for s in t.steps), sum(s.drafted for s in t.steps), len(t.steps)) for t in traces],
        dtype=torch.float64,
    )  # [prompts, 3]
    accepted, drafted, steps = (float(x) for x in per.sum(dim=0))
    return {
        "accepted": int(accepted),
        "drafted": int(drafted),
        "steps": int(steps),
        DRAFT_ACCEPTANCE: accepted / drafted if drafted else math.nan,
        DRAFT_ACCEPTANCE_CI95: ratio_ci95(per[:, 0], per[:, 1]),
        MEAN_ACCEPTANCE_LENGTH: 1 + accepted / steps,
        MEAN_ACCEPTANCE_LENGTH_CI95: ratio_ci95(per[:, 0], per[:, 2]),
    }


def _without_min_length(trace: AssistedTrace) -> AssistedTrace:
    """The trace with the draft side's MinLengthLogitsProcessor left out. With an EOS set, HF hands the
    draft's generate() `min_new_tokens = max(0, target min_length − context)` = 0 (the target's own
    processors are checked to hold no min length), which becomes min_length = the context length: a
    processor that masks EOS only before the context's end, so never."""
    kept = tuple(
        tuple(p for p in processors if p[0] != "MinLengthLogitsProcessor")
        for processors in trace.draft_processors
    )
    return replace(trace, draft_processors=kept)


def trace_all(target: CausalLM, draft: PreTrainedModel, comparison: Comparison) -> list[AssistedTrace]:
    """Every prompt through HF assisted generation, traced; MisconfiguredComparison unless the settings took
    effect (nothing is timed before this passes; the traced runs are also the warm-up)."""
    kwargs = assisted_kwargs(comparison)
    traces, problems = [], []
    for i, (prompt, seed) in enumerate(zip(comparison.prompts, comparison.seeds, strict=True)):
        trace = trace_assisted(target, draft, list(prompt), seed, kwargs)
        found = check_assisted(_without_min_length(trace), comparison)
        found += check_draft_scores(draft, trace, comparison.tau) if i == 0 else []
        problems += [f"prompt {i}: {problem}" for problem in found]
        traces.append(trace)
    if problems:
        raise MisconfiguredComparison(
            f"not measured: HF assisted generation did not run as configured (τ={comparison.tau}, "
            f"γ={comparison.gamma}):\n  " + "\n  ".join(problems[:12])
        )
    return traces


def timed_speedup(
    target: CausalLM, draft: PreTrainedModel, comparison: Comparison, traces: list[AssistedTrace]
) -> tuple[float, float, float]:
    """Σ target-only seconds / Σ assisted seconds over the prompts, its 95% half-width, and Σ assisted
    seconds."""
    kwargs = assisted_kwargs(comparison)
    warm = kwargs | {"max_new_tokens": 4, "min_new_tokens": 4}  # the traced runs warmed the assisted path
    _target_only_seconds(target, list(comparison.prompts[0]), 0, warm)
    times = []
    for prompt, seed, trace in zip(comparison.prompts, comparison.seeds, traces, strict=True):
        tokens, assisted = run_assisted(target, draft, list(prompt), seed, kwargs)
        if tuple(tokens) != trace.tokens:
            raise MisconfiguredComparison(
                "an untraced assisted decode differed from its traced run (same seed)"
            )
        length = len(tokens)
        alone = kwargs | {"max_new_tokens": length, "min_new_tokens": length}  # the same work, EOS or not
        times.append((_target_only_seconds(target, list(prompt), seed, alone), assisted))
    per = torch.tensor(times, dtype=torch.float64)  # [prompts, 2]
    return float(per[:, 0].sum() / per[:, 1].sum()), ratio_ci95(per[:, 0], per[:, 1]), float(per[:, 1].sum())


@torch.no_grad()
def _target_only_seconds(target: CausalLM, prompt: list[int], seed: int, kwargs: dict[str, Any]) -> float:
    torch.manual_seed(seed)
    input_ids = torch.tensor([prompt], device=target.device)
    started = time.perf_counter()
    out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    out[0, -1].item()  # waits for the device
    return time.perf_counter() - started


def check_band(
    band: dict[str, Any],
    target: CausalLM,
    draft: PreTrainedModel,
    prompts: list[list[int]],
    settings: dict,
) -> BandCheck:
    """Trace, count and time one band's draft at its binding τ_dec (`settings`: max_new_tokens, eos, pad,
    seed)."""
    started = time.perf_counter()
    tau, gamma = float(band[SPEEDUP]["tau_dec"]), int(band["gamma"])
    seeds = tuple(prompt_seed(settings["seed"], i) for i in range(len(prompts)))
    comparison = Comparison(
        tau,
        gamma,
        settings["max_new_tokens"],
        settings["eos"],
        tuple(map(tuple, prompts)),
        seeds,
        settings["pad"],
    )
    configure_assistant(draft, comparison)
    traces = trace_all(target, draft, comparison)
    counts = traced_counts(traces)
    speedup, speedup_ci95, assisted_seconds = timed_speedup(target, draft, comparison, traces)
    ours = run_empirical(
        target, draft, prompts, tau, gamma, settings["max_new_tokens"], settings["eos"], 1, settings["seed"]
    )
    ours_steps = ours.tokens / ours.block_efficiency
    overhead = assisted_seconds / counts["steps"] - ours.speculative_seconds / ours_steps
    expected = band["expected"]
    return BandCheck(
        alias=band["alias"],
        tau_dec=tau,
        draft=band["draft"],
        gamma=gamma,
        prompts=len(prompts),
        steps=int(counts["steps"]),
        drafted=int(counts["drafted"]),
        accepted=int(counts["accepted"]),
        draft_acceptance=counts[DRAFT_ACCEPTANCE],
        draft_acceptance_ci95=counts[DRAFT_ACCEPTANCE_CI95],
        predicted_draft_acceptance=expected.get(DRAFT_ACCEPTANCE_HF, math.nan),
        predicted_draft_acceptance_ci95=expected.get(DRAFT_ACCEPTANCE_CI95, math.nan),
        mean_acceptance_length=counts[MEAN_ACCEPTANCE_LENGTH],
        mean_acceptance_length_ci95=counts[MEAN_ACCEPTANCE_LENGTH_CI95],
        predicted_mean_acceptance_length=expected.get(MEAN_ACCEPTANCE_LENGTH_HF, math.nan),
        speedup=speedup,
        speedup_ci95=speedup_ci95,
        predicted_speedup=band[SPEEDUP]["value"],
        predicted_speedup_basis=band[SPEEDUP]["basis"],
        seconds=time.perf_counter() - started,
        ours_speedup=ours.speedup,
        ours_speedup_ci95=ours.speedup_ci95,
        hf_overhead_ms_per_step=1e3 * overhead,
        route=band.get("route", "speculative"),
    )


def bands_to_check(
    plan: dict[str, Any], export_dir: Path, candidates: dict[str, Path]
) -> list[dict[str, Any]]:
    """The bands `--verify` measures, each as check_band reads it plus the draft's `folder` and the `route`:
    every routed band with its exported draft, and every declined band whose best candidate's folder is in
    `candidates` (draft name -> folder), in the plan's order."""
    checked = []
    for band in plan["bands"]:
        if band["route"] == "speculative":
            checked.append(band | {"folder": str(export_dir / band["draft"]), "route": "speculative"})
        elif (best := band.get("best_candidate")) and best["draft_name"] in candidates:
            name = best["draft_name"]
            declined = {"alias": band["alias"], "draft": name, "route": "declined"}
            checked.append(best | declined | {"folder": str(candidates[name])})
    return checked


def verify_export(
    export_dir: Path,
    prompts: list[list[int]],
    settings: dict,
    dtype: str = "auto",
    candidates: dict[str, Path] | None = None,
) -> list[BandCheck]:
    """Check every speculative band of an export (routing.json, its drafts) against HF assisted generation,
    and every declined band's best candidate among `candidates` (draft name -> the sweep's draft folder)."""
    from specray.models.loading import load_model

    plan = json.loads((export_dir / "routing.json").read_text())
    bands = bands_to_check(plan, export_dir, candidates or {})
    if not bands:
        return []
    target = load_model(plan["target"]["name_or_path"], dtype)
    checks = []
    for band in bands:
        draft = load_model(band["folder"], dtype)
        checks.append(check_band(band, target, draft, prompts, settings))
    return checks
