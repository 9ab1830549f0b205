"""Small views of a sweep's plan that several tests read (`specray.sweep.plan` builds the real thing)."""

from __future__ import annotations

from pathlib import Path

from specray.config import SweepSpec
from specray.draft import Draft
from specray.sweep.plan import plan_sweep


def prompts_fingerprints(spec: SweepSpec) -> dict[str, str]:
    """Per evaluated test set, the key of its prompts, as the plan computes it."""
    return {name: prompts.key for name, prompts in plan_sweep(spec).prompt_sets.items()}


def draft_at(name: str, path: str, key: str = "", tau_kd: float | None = None) -> Draft:
    """A draft record for evaluation only: its name, folder, key and single τ_kd (None: no single τ_kd)."""
    mixture = {} if tau_kd is None else {tau_kd: 1.0}
    return Draft(name, None if tau_kd is None else "offline", mixture, Path(path), key)


def evaluated_examples(spec: SweepSpec) -> dict[str, list]:
    """Per evaluated test set, its examples, one per test prompt."""
    return {name: list(prompts.examples) for name, prompts in plan_sweep(spec).prompt_sets.items()}


def prompt_categories(spec: SweepSpec) -> dict[str, list[str]]:
    """Per evaluated test set with categories, each test prompt's category."""
    return {name: list(p.categories) for name, p in plan_sweep(spec).prompt_sets.items() if p.categories}


def encode_test_prompts(spec: SweepSpec, tokenizer: object, target_path: str) -> dict[str, list[list[int]]]:
    """Every test prompt's token ids, as the stage runner encodes them (earlier answers by `target_path`)."""
    from specray.sweep.stages import encode

    plan = plan_sweep(spec)
    return {name: encode(plan, p, tokenizer, target_path) for name, p in plan.prompt_sets.items()}  # type: ignore[arg-type]
