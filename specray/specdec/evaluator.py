"""Evaluate (draft, τ_dec, test set, estimator) cells against one loaded target, in a single process.

The Ray eval pool (`workers.py`) only wraps this class in actors. Target continuations for the analytic
estimator are sampled once per (test set, τ_dec) and cached on disk (atomic writes), so every actor and
every later run reuses them; the target's pass over them is kept in memory and shared by all drafts.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import PreTrainedModel

from specray.models.loading import check_same_vocabulary, load_model, load_tokenizer
from specray.models.zoo import cache_dir
from specray.specdec.analytic import AnalyticEstimator, Continuations, sample_continuations
from specray.specdec.decoder import measure_cost_ratio
from specray.specdec.empirical import EmpiricalResult, run_empirical


@dataclass(frozen=True)
class EvalJob:
    """One cell of the grid. `draft` is a display name (e.g. offline/tau_kd=0.6), `draft_path` an HF dir."""

    draft: str
    draft_path: str
    tau_dec: float
    test_set: str
    estimator: Literal["analytic", "empirical"]

    @property
    def key(self) -> str:
        return f"{self.draft}|{self.test_set}|tau_dec={self.tau_dec:g}|{self.estimator}"


@dataclass(frozen=True)
class EvalSettings:
    gamma: int
    repeats: int
    max_new_tokens: int
    empirical_prompts: int
    seed: int = 0
    cost_ratio: float | None = None  # c; None = measure it on this hardware
    batch_size: int = 16


def continuations_file(
    folder: Path, target_id: str, prompts: list[list[int]], tau: float, settings: EvalSettings
) -> Path:
    """Where the target's samples for these prompts at τ are cached (JSON: {"tau", "responses"})."""
    payload = json.dumps([target_id, prompts, tau, settings.max_new_tokens, settings.seed])
    return folder / f"{hashlib.sha256(payload.encode()).hexdigest()[:20]}.json"


def default_continuations_dir() -> Path:
    return cache_dir() / "continuations"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


class Evaluator:
    """Holds the target (loaded once) and the test prompts; evaluates any draft on any cell."""

    def __init__(
        self,
        target_path: str,
        prompts: dict[str, list[list[int]]],
        settings: EvalSettings,
        dtype: str = "auto",
        trust_remote_code: bool = False,
        device: str = "cpu",
        continuations_dir: Path | None = None,
    ):
        self.target_path, self.prompts, self.settings = target_path, prompts, settings
        self.continuations_dir = continuations_dir or default_continuations_dir()
        self.tokenizer = load_tokenizer(target_path, trust_remote_code)
        self.target = load_model(target_path, dtype, trust_remote_code, device)
        self.dtype, self.trust_remote_code, self.device = dtype, trust_remote_code, device
        self._drafts: dict[str, PreTrainedModel] = {}
        self._estimators: dict[tuple[str, float], AnalyticEstimator] = {}
        self._cost_ratios: dict[str, float] = {}

    def evaluate(self, job: EvalJob) -> dict[str, Any]:
        """The metrics of one cell as a flat record (names as in DESIGN.md)."""
        if job.test_set not in self.prompts:
            raise ValueError(f"unknown test set {job.test_set!r}; have {sorted(self.prompts)}")
        started = time.perf_counter()
        draft = self._draft(job.draft_path)
        c = self._cost_ratio(job.draft_path, draft)
        if job.estimator == "analytic":
            metrics = asdict(
                self._estimator(job.test_set, job.tau_dec).evaluate(draft, self.settings.gamma, c)
            )
        else:
            metrics = asdict(self._empirical(job, draft))
        seconds = time.perf_counter() - started
        return {**asdict(job), **metrics, "c": c, "gamma": self.settings.gamma, "seconds": seconds}

    def _empirical(self, job: EvalJob, draft: PreTrainedModel) -> EmpiricalResult:
        s = self.settings
        prompts = self.prompts[job.test_set][: s.empirical_prompts]
        eos = self.tokenizer.eos_token_id
        return run_empirical(
            self.target, draft, prompts, job.tau_dec, s.gamma, s.max_new_tokens, eos, s.repeats, s.seed
        )

    def _draft(self, path: str) -> PreTrainedModel:
        if path not in self._drafts:
            check_same_vocabulary(self.tokenizer, load_tokenizer(path), self.target_path, path)
            self._drafts.clear()  # keep one draft resident: jobs arrive grouped by draft
            self._drafts[path] = load_model(path, self.dtype, self.trust_remote_code, self.device)
        return self._drafts[path]

    def _cost_ratio(self, path: str, draft: PreTrainedModel) -> float:
        if self.settings.cost_ratio is not None:
            return self.settings.cost_ratio
        if path not in self._cost_ratios:
            prompt = next(iter(self.prompts.values()))[0]
            self._cost_ratios[path] = measure_cost_ratio(self.target, draft, prompt)
        return self._cost_ratios[path]

    def _estimator(self, test_set: str, tau: float) -> AnalyticEstimator:
        key = (test_set, tau)
        if key not in self._estimators:
            self._estimators.clear()  # the target's pass is large; keep the current cell's only
            continuations = self.continuations(test_set, tau)
            pad = self.tokenizer.pad_token_id
            self._estimators[key] = AnalyticEstimator(
                self.target, continuations, pad, self.settings.batch_size
            )
        return self._estimators[key]

    @torch.no_grad()
    def continuations(self, test_set: str, tau: float) -> Continuations:
        """Target samples for a test set at τ, from the disk cache or sampled once and cached."""
        prompts = self.prompts[test_set]
        path = continuations_file(self.continuations_dir, self.target_path, prompts, tau, self.settings)
        if path.exists():
            return Continuations(tau, prompts, json.loads(path.read_text())["responses"])
        s = self.settings
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        continuations = sample_continuations(self.target, prompts, tau, s.max_new_tokens, eos, s.seed, pad)
        _write_atomic(path, json.dumps({"tau": tau, "responses": continuations.responses}))
        return continuations
