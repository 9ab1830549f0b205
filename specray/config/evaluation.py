"""The sections that measure drafts: `eval` (with its lossy `lenience`) and `tune` (the mixture search)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from specray.config.base import (
    Divergence,
    Estimator,
    Frozen,
    LenienceFunction,
    Paradigm,
    Temperature,
    unique_sorted,
)
from specray.config.vocabulary import WORKLOADS


class LenienceSpec(Frozen):
    """Lossy speculative decoding (DistillSpec Algorithm A.1): accept y with min(1, f(p(y), ε) / q(y)).

    `function` and `epsilon` are grid axes like τ_dec: every (function, ε < 1) pair is a cell coordinate.
    ε = 1 is the lossless rule whatever the function, so it is one cell, not one per function. At τ_dec = 0
    lenience changes nothing (greedy verification has no ratio to relax; `specray/ops/lenience.py`), so
    lossy cells are planned only at τ_dec > 0.
    """

    function: list[LenienceFunction] = Field(
        default=["lin"], min_length=1, description="f: lin (p/ε), sq (p/ε²), exp (p^ε); one or a list"
    )
    epsilon: list[Annotated[float, Field(gt=0.0, le=1.0)]] = Field(
        default=[1.0], min_length=1, description="ε in (0, 1]; 1 = lossless; one value or a list"
    )

    @field_validator("function", "epsilon", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return v if isinstance(v, list | tuple) else [v]

    @field_validator("function")
    @classmethod
    def _functions_unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"function has duplicates: {v}")
        return v

    @field_validator("epsilon")
    @classmethod
    def _epsilons_sorted_unique(cls, v: list[float]) -> list[float]:
        return sorted(unique_sorted(v, "epsilon"), reverse=True)  # lossless first

    def points(self, tau_dec: float) -> list[tuple[str | None, float]]:
        """The (function, ε) cells at one τ_dec: (None, 1.0) for lossless, then every lossy pair."""
        lossy: list[tuple[str | None, float]] = (
            [(f, e) for f in self.function for e in self.epsilon if e < 1.0] if tau_dec > 0 else []
        )
        lossless: list[tuple[str | None, float]] = [(None, 1.0)] if 1.0 in self.epsilon or not lossy else []
        return lossless + lossy


class WorkloadSpec(Frozen):
    """A workload (DESIGN: test prompts by category, each at its own request temperature): which test set,
    each category's temperature (a preset such as FastChat's `mt_bench`, or a mapping) and its weight (its
    share of the test set's prompts, or given). Its speedup is the weighted mean of the categories' speedups,
    each at its own temperature."""

    test_set: str = Field(min_length=1, description="a test set with categories (a spec_bench source)")
    temperatures: str | dict[str, Temperature] = Field(
        description="a preset (mt_bench) or category -> request temperature"
    )
    weights: Literal["share"] | dict[str, Annotated[float, Field(gt=0.0)]] = Field(
        default="share", description="share: each category's share of the test set; or category -> weight"
    )

    @field_validator("temperatures")
    @classmethod
    def _known_preset(cls, v: str | dict[str, float]) -> str | dict[str, float]:
        if isinstance(v, str) and v not in WORKLOADS:
            raise ValueError(f"unknown workload preset {v!r}; presets: {', '.join(WORKLOADS)}")
        return v

    @property
    def table(self) -> dict[str, float]:
        """category -> request temperature."""
        return dict(WORKLOADS[self.temperatures]) if isinstance(self.temperatures, str) else self.temperatures


class EvalSpec(Frozen):
    temperatures: list[Temperature] = Field(min_length=1, description="the τ_dec grid")
    gamma: list[Annotated[int, Field(ge=1, le=64)]] = Field(
        default=[4], min_length=1, description="γ: draft tokens per block; one value or a list (a grid axis)"
    )
    repeats: int = Field(default=5, ge=1, description="R: decodes per prompt (empirical)")
    max_new_tokens: int = Field(default=128, ge=1)
    estimators: list[Estimator] = Field(default=["analytic"], min_length=1)
    empirical_temperatures: list[Temperature] = Field(default=[], description="τ_dec cells run empirically")
    empirical_prompts: int = Field(default=16, ge=1)
    empirical_drafts: Literal["all", "diagonal"] = Field(
        default="all",
        description="diagonal: only drafts with τ_kd = τ_dec, mixtures and the un-distilled one",
    )
    test_sets: list[str] = Field(
        default=["in_domain", "out_of_domain"],
        min_length=1,
        description="test sets evaluated: in_domain, out_of_domain and the names in data.test_sets",
    )
    workload: WorkloadSpec | None = Field(
        default=None, description="a traffic mix: each category of a test set at its request temperature"
    )
    lenience: LenienceSpec = Field(
        default=LenienceSpec(), description="lossy decoding grid (ε = 1: lossless)"
    )
    quality_ends: bool = Field(
        default=False,
        description="also decode each model alone at every empirical τ_dec: target-only and draft-only "
        "quality, the two ends of the quality-speedup trade-off (DistillSpec Fig. 5b)",
    )
    batch_sizes: list[Annotated[int, Field(ge=1, le=1024)]] = Field(
        default=[1],
        min_length=1,
        description="B: batch sizes the speedup is modelled at (step costs timed at each); one or a list",
    )
    empirical_batch_sizes: list[Annotated[int, Field(ge=1, le=1024)]] = Field(
        default=[1],
        min_length=1,
        description="B of the empirical cells: 1 decodes one prompt at a time, B > 1 the batched decoder",
    )
    draft_cost_ratio: float | None = Field(
        default=None,
        ge=0.0,
        description="c; None = measure the step costs (a fixed c models verification as one target step)",
    )
    projected_cost_ratio: float | None = Field(
        default=None, gt=0.0, description="also report speedup_model at this c (e.g. a target pair's)"
    )
    timing_precision: float = Field(
        default=0.02,  # specdec.cost's own default
        gt=0.0,
        le=0.5,
        description="the step costs are timed until each 95% interval is within ± this fraction (or 2 min)",
    )
    drafts_per_pass: int = Field(
        default=8, ge=1, description="drafts an eval actor holds while streaming one target pass"
    )
    replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(default=1.0, ge=0)
    num_gpus: float = Field(default=0.0, ge=0)
    seed: int = 0

    @field_validator("temperatures")
    @classmethod
    def _sorted_unique(cls, v: list[float]) -> list[float]:
        return unique_sorted(v, "temperatures")

    @field_validator("gamma", "batch_sizes", "empirical_batch_sizes", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return v if isinstance(v, list | tuple) else [v]  # one value; a wrong scalar is then named as one

    @field_validator("gamma", "batch_sizes", "empirical_batch_sizes")
    @classmethod
    def _sorted_unique_ints(cls, v: list[int], info: ValidationInfo) -> list[int]:
        return unique_sorted(v, str(info.field_name))

    @model_validator(mode="after")
    def _batches_fit(self) -> EvalSpec:
        too_big = [b for b in self.empirical_batch_sizes if b > self.empirical_prompts]
        if too_big and "empirical" in self.estimators:
            raise ValueError(
                f"empirical_batch_sizes {too_big} exceed empirical_prompts ({self.empirical_prompts}): a "
                "batch of B rows decodes B different prompts; raise empirical_prompts or lower the B"
            )
        if self.draft_cost_ratio is not None and self.batch_sizes != [1]:
            raise ValueError(
                f"draft_cost_ratio (a fixed c) says nothing about batching, but batch_sizes is "
                f"{self.batch_sizes}: leave draft_cost_ratio unset so the step costs are measured at each B"
            )
        return self


class TuneSpec(Frozen):
    """`specray tune`: a Ray Tune search over mixtures of the τ_kd shards (see specray/sweep/tune/run.py)."""

    num_samples: int = Field(default=16, ge=1)
    search: Literal["optuna", "random"] = "optuna"
    space: Literal["weights", "subset"] = "weights"
    subset_size: int = Field(default=3, ge=1)
    objective_temperatures: list[Temperature] = Field(default=[0.8, 1.0], min_length=1)
    max_concurrent_trials: int = Field(default=2, ge=1)
    early_stopping: Literal["asha", "none"] = Field(
        default="asha",
        description="asha: ASHA stops weak trials early, by when they report (cheaper; two runs can pick "
        "different winners); none: every trial runs its whole budget and the searcher proposes each batch of "
        "max_concurrent_trials trials once the previous batch has ended, so the search's choices depend on "
        "the trials' results only and the same command picks the same winner",
    )
    asha_grace_period: int = Field(default=1, ge=1, description="in distillation reports")
    asha_reduction_factor: int = Field(default=2, ge=2)
    paradigm: Paradigm = "offline"
    steps: int | None = Field(
        default=None,
        ge=1,
        description="the search budget: optimizer steps per trial and per search-budget baseline; None = "
        "distill.steps (online trials too: one budget for every trial, whatever its paradigm)",
    )
    paradigms: list[Paradigm] = Field(default=[], description="also search the paradigm; [] = `paradigm`")
    divergences: list[Divergence] = Field(default=[], description="also search the divergence (online)")
    onpolicy_fractions: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default=[], description="also search λ (online); [] = distill.onpolicy_fraction"
    )
    manual_top_k: int = Field(default=3, ge=1, description="τ_kd in the paper's manual recipe")
    registered_model: str | None = Field(
        default=None, min_length=1, description="Model Registry name; None = <sweep name>-tuned-draft"
    )
    seed: int = 0
    final_steps: int | None = Field(
        default=None,
        ge=1,
        description="optimizer steps of the drafts Table 3 compares, retrained after the search (the "
        "winner's recipe, the best single τ_kd, the manual recipe, and every single τ_kd once for the "
        "rank agreement); None = distill's steps for `paradigm` (the included sweep's own budget, so a "
        "finished `specray run` of that sweep supplies its single-τ_kd drafts)",
    )
    replicates: int = Field(
        default=1,
        ge=1,
        description="training replicates at tune.final_steps of each draft Table 3 compares (the winner's "
        "recipe, the best single τ_kd, the manual recipe), replicate r with distill.seed + r: Table 3's "
        "intervals and the composition verdict then cover training too",
    )
    controls: bool = Field(
        default=False,
        description="also train, per mixture Table 3 compares, its control: as many teacher samples per "
        "prompt as the mixture has τ_kd, all at the best single τ_kd (sample j with teacher.seed + j), "
        "drawn by the mixture's weights, with the same steps and replicates. A mixture's gain over its "
        "control is the temperatures', not the extra samples' (the teacher generates the extra samples once, "
        "cached)",
    )

    @field_validator("objective_temperatures", "paradigms", "divergences", "onpolicy_fractions")
    @classmethod
    def _no_duplicates(cls, v: list, info: ValidationInfo) -> list:
        if len(set(v)) != len(v):
            raise ValueError(f"{info.field_name} has duplicates: {list(v)}")
        return v
