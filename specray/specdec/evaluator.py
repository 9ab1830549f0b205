"""Evaluate cells against one loaded target, in a single process (the Ray eval pool only wraps this class).

The unit of work is a *pass*: the analytic cells of several drafts at one (test set, τ_dec) — scored in one
streaming pass over the target's continuations, every γ from the same β — or one empirical cell. Target
continuations are sampled once per (test set, τ_dec) and cached on disk under a key of everything they
depend on, so every actor and every later run reuses them (a changed γ or ε resamples nothing).

Given the test sets' examples, empirical cells also score the task quality of what they decoded
(`specray/quality.py`), and an `ends` cell decodes the target alone and the draft alone on the same
prompts and seeds: the two ends of the quality–speedup trade-off.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specray.data.examples import Example
from specray.files import cache_dir, write_json
from specray.keys import digest
from specray.locks import producing
from specray.metrics import (
    PER_PROMPT_QUALITY,
    QUALITY,
    QUALITY_DRAFT,
    QUALITY_METRIC,
    QUALITY_TARGET,
    TOKENS_ALONE,
)
from specray.models.loading import check_same_vocabulary, decode_text, load_model, load_tokenizer
from specray.quality import prompt_scores, quality_metrics
from specray.specdec.analytic import LOSSLESS, AnalyticEstimator, Betas, analytic_result
from specray.specdec.continuations import Continuations, sample_continuations
from specray.specdec.cost import measure_step_costs
from specray.specdec.empirical import EmpiricalResult, decode_alone, run_empirical
from specray.specdec.lossy import lossy_betas
from specray.specdec.records import CellRecord, EvalJob, EvalSettings, StepCosts

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import PreTrainedModel

__all__ = ["CellRecord", "EvalJob", "EvalSettings", "Evaluator", "continuations_file"]


def continuations_file(
    folder: Path, target_id: str, prompts: list[list[int]], tau: float, settings: EvalSettings, device: str
) -> Path:
    """Where the target's samples for these prompts at τ are cached (JSON: {"tau", "responses"})."""
    inputs = {
        "target": target_id,
        "prompts": prompts,
        "tau": tau,
        "max_new_tokens": settings.max_new_tokens,
        "seed": settings.seed,
        "device": device,
    }
    return folder / f"{digest(inputs)}.json"


def _betas_key(job: EvalJob) -> tuple:
    """Where a cell's β is in `Evaluator._analytic`: one lossless β per draft, a lossy one per γ too."""
    if job.epsilon == 1.0:
        return job.draft_path, LOSSLESS, None
    return job.draft_path, (job.lenience, job.epsilon), job.gamma


def default_continuations_dir() -> Path:
    return cache_dir() / "continuations"


class Evaluator:
    """Holds the target (loaded once) and the test prompts; evaluates any draft on any cell. `examples`
    (per test set, in the prompts' order) are what decoded outputs are scored against; without them no
    quality is measured."""

    def __init__(
        self,
        target_path: str,
        prompts: dict[str, list[list[int]]],
        settings: EvalSettings,
        dtype: str = "auto",
        trust_remote_code: bool = False,
        device: str = "cpu",
        continuations_dir: Path | None = None,
        target_id: str | None = None,
        examples: dict[str, list[Example]] | None = None,
    ):
        self.target_path, self.prompts, self.settings = target_path, prompts, settings
        self.examples = examples or {}
        self.target_id = target_id or target_path  # what names the target in the continuations' key
        self.continuations_dir = continuations_dir or default_continuations_dir()
        self.tokenizer = load_tokenizer(target_path, trust_remote_code)
        self.target = load_model(target_path, dtype, trust_remote_code, device)
        self.dtype, self.trust_remote_code, self.device = dtype, trust_remote_code, device

    def evaluate(self, jobs: Sequence[EvalJob]) -> list[CellRecord]:
        """The records of one pass: analytic cells sharing (test set, τ_dec), or one empirical cell."""
        first = jobs[0]
        if first.test_set not in self.prompts:
            raise ValueError(f"unknown test set {first.test_set!r}; have {sorted(self.prompts)}")
        if first.estimator != "analytic":
            if len(jobs) != 1:
                raise ValueError(f"an {first.estimator} pass holds exactly one cell")
            return [self._empirical(first) if first.estimator == "empirical" else self._ends(first)]
        if any(
            (j.test_set, j.tau_dec, j.estimator) != (first.test_set, first.tau_dec, "analytic") for j in jobs
        ):
            raise ValueError("an analytic pass holds cells of one test set and one τ_dec")
        return self._analytic(jobs)

    def _analytic(self, jobs: Sequence[EvalJob]) -> list[CellRecord]:
        costs = self.settings.step_costs
        if costs is None:
            raise ValueError("analytic cells need the step costs: measure them first (measure_step_costs)")
        started = time.perf_counter()
        paths = list(dict.fromkeys(job.draft_path for job in jobs))  # each draft once, in order
        drafts = [self._load_draft(path) for path in paths]
        first = jobs[0]
        pad = self.tokenizer.pad_token_id
        eos = self.tokenizer.eos_token_id
        betas: dict[tuple, Betas] = {}
        if any(job.epsilon == 1.0 for job in jobs):  # one target pass serves every draft's lossless β
            continuations = self.continuations(first.test_set, first.tau_dec)
            estimator = AnalyticEstimator(
                self.target, continuations, pad, self.settings.batch_size, eos_id=eos
            )
            for path, result in zip(paths, estimator.betas(drafts), strict=True):
                betas[path, LOSSLESS, None] = result
        s, models = self.settings, dict(zip(paths, drafts, strict=True))
        for job in jobs:  # a lossy point follows its own decoder's output (specdec/lossy.py)
            key = (job.draft_path, (job.lenience, job.epsilon), job.gamma)
            if job.epsilon < 1.0 and key not in betas:
                assert job.lenience is not None, "a lossy point (ε < 1) names its lenience function"
                betas[key] = lossy_betas(
                    self.target,
                    models[job.draft_path],
                    self.prompts[job.test_set],
                    job.tau_dec,
                    job.lenience,
                    job.epsilon,
                    job.gamma,
                    s.max_new_tokens,
                    eos,
                    s.seed,
                    pad,
                    s.batch_size,
                )
        seconds = (time.perf_counter() - started) / len(jobs)  # the pass's time, shared by its cells
        subset, limit = self.settings.empirical_prompts, self.settings.max_new_tokens
        c = costs.cost_ratio(costs.batch_sizes[0])
        return [
            CellRecord.of(
                job,
                c,
                seconds,
                asdict(analytic_result(betas[_betas_key(job)], job.gamma, costs, subset, limit)),
            )
            for job in jobs
        ]

    def _empirical(self, job: EvalJob) -> CellRecord:
        started = time.perf_counter()
        s = self.settings
        prompts = self.prompts[job.test_set][: s.empirical_prompts]
        eos = self.tokenizer.eos_token_id
        draft = self._load_draft(job.draft_path)
        result: EmpiricalResult = run_empirical(
            self.target,
            draft,
            prompts,
            job.tau_dec,
            job.gamma,
            s.max_new_tokens,
            eos,
            s.repeats,
            s.seed,
            job.lenience,
            job.epsilon,
            job.batch_size,
        )
        metrics = asdict(result)
        texts = self._texts(metrics.pop("outputs"))
        metrics |= self._quality(job.test_set, texts, QUALITY)
        if QUALITY_METRIC in metrics:  # per prompt, the headline metric (nan where a prompt has none)
            scores = prompt_scores(self.examples[job.test_set][: len(texts)], texts)
            metrics[PER_PROMPT_QUALITY] = [s.get(metrics[QUALITY_METRIC], math.nan) for s in scores]
        return CellRecord.of(job, None, time.perf_counter() - started, metrics)

    def _ends(self, job: EvalJob) -> CellRecord:
        """Target-only and draft-only decodes on the empirical cells' prompts and seeds, and their quality."""
        started = time.perf_counter()
        s = self.settings
        prompts = self.prompts[job.test_set][: s.empirical_prompts]
        eos = self.tokenizer.eos_token_id
        metrics: dict[str, float] = {}
        models = {QUALITY_TARGET: self.target, QUALITY_DRAFT: self._load_draft(job.draft_path)}
        for quality, model in models.items():
            outputs = decode_alone(model, prompts, job.tau_dec, s.max_new_tokens, eos, s.repeats, s.seed)
            metrics |= self._quality(job.test_set, self._texts(outputs), quality)
            metrics[TOKENS_ALONE[quality]] = sum(
                len(tokens) for per_prompt in outputs for tokens in per_prompt
            )
        return CellRecord.of(job, None, time.perf_counter() - started, metrics)

    def _texts(self, outputs: list[list[list[int]]]) -> list[list[str]]:
        """Decoded token ids (per prompt, per repeat) as text."""
        return [[decode_text(self.tokenizer, t) for t in per] for per in outputs]

    def _quality(self, test_set: str, texts: list[list[str]], prefix: str) -> dict:
        """Quality metrics of decoded texts (per prompt, per repeat) against the test set's examples."""
        if test_set not in self.examples:
            return {}
        examples = self.examples[test_set][: len(texts)]
        return quality_metrics(examples, texts, prefix, seed=self.settings.seed)

    def _load_draft(self, path: str) -> PreTrainedModel:
        check_same_vocabulary(self.tokenizer, load_tokenizer(path), self.target_path, path)
        return load_model(path, self.dtype, self.trust_remote_code, self.device)

    def measure_step_costs(
        self, draft_path: str, batch_sizes: Sequence[int] = (1,), gammas: Sequence[int] = (4,)
    ) -> StepCosts:
        """The step costs of this draft's architecture against the target, on this evaluator's device, on
        the first test set's prompts (see `specdec/cost.py`)."""
        prompts = next(iter(self.prompts.values()))[: max(batch_sizes)]
        draft, precision = self._load_draft(draft_path), self.settings.timing_precision
        return measure_step_costs(self.target, draft, prompts, batch_sizes, gammas, rel_precision=precision)

    @torch.no_grad()
    def continuations(self, test_set: str, tau: float) -> Continuations:
        """Target samples for a test set at τ, from the disk cache or sampled once and cached."""
        prompts = self.prompts[test_set]
        device = torch.device(self.device).type
        path = continuations_file(self.continuations_dir, self.target_id, prompts, tau, self.settings, device)
        if path.exists():
            return Continuations(tau, prompts, json.loads(path.read_text())["responses"])
        with producing([path], f"target continuations of {test_set} at τ_dec {tau:g}"):
            if path.exists():  # another sweep sharing the cache sampled them while this one waited
                return Continuations(tau, prompts, json.loads(path.read_text())["responses"])
            s = self.settings
            eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
            continuations = sample_continuations(
                self.target, prompts, tau, s.max_new_tokens, eos, s.seed, pad, keep_logits=False
            )
            write_json(path, {"tau": tau, "responses": continuations.responses}, indent=None)
        return continuations
