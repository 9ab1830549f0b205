"""A cheap acceptance estimate while distilling: the analytic estimator on a few validation prompts.

The target's side (its continuations at every τ_dec and its distributions along them) is computed once when
the probe is built; each call then costs one teacher-forced pass of the draft per τ_dec. The numbers form the
acceptance-vs-KD-steps curve (paper Figure 6) and are the signal Tune's early stopping reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specray.data.templates import encode_prompts
from specray.distill.curves import PromptSums
from specray.specdec.analytic import AnalyticEstimator, Betas, sample_continuations

if TYPE_CHECKING:  # the probe itself runs without the config (the GPU test suite has no pydantic)
    from specray.config import DataSpec
    from specray.data.examples import Example

PROBE_PROMPTS = 16  # enough for a trend, cheap enough to run every few steps


def probe_prompts(
    validation: Sequence[Example], tokenizer: PreTrainedTokenizerBase, data: DataSpec
) -> list[list[int]]:
    """Token ids of the first PROBE_PROMPTS validation prompts, encoded like the test prompts."""
    return encode_prompts(list(validation[:PROBE_PROMPTS]), tokenizer, data)


class AcceptanceProbe:
    """Target continuations and distributions at each τ_dec, held in memory; scores any draft."""

    def __init__(
        self,
        target: PreTrainedModel,
        prompts: list[list[int]],
        taus_dec: Sequence[float],
        max_new_tokens: int,
        eos_token_id: int | None,
        pad_token_id: int,
        seed: int = 0,
    ) -> None:
        self.estimators = {
            float(tau): AnalyticEstimator(
                target,
                sample_continuations(target, prompts, tau, max_new_tokens, eos_token_id, seed, pad_token_id),
                pad_token_id,
                keep_target=True,  # a few prompts, scored at every report: keep the target's side
            )
            for tau in taus_dec
        }

    @torch.no_grad()
    def __call__(self, draft: PreTrainedModel) -> tuple[dict[float, float], dict[float, PromptSums]]:
        """Per τ_dec the acceptance α and the per-prompt response tokens and β sums it pools (in the probe
        prompts' order, what the report's paired bootstrap over prompts resamples); the draft is put in
        eval mode and restored afterwards."""
        was_training = draft.training
        draft.eval()
        try:
            acceptance, per_prompt = {}, {}
            for tau, estimator in self.estimators.items():
                acceptance[tau], per_prompt[tau] = _pooled(estimator.betas([draft])[0])
            return acceptance, per_prompt
        finally:
            draft.train(was_training)


def _pooled(betas: Betas) -> tuple[float, PromptSums]:
    """Token-pooled mean β (the acceptance rate α) and the per-prompt sums it pools."""
    tokens = betas.mask.sum(dim=1)  # [n]
    sums = (betas.beta.double() * betas.mask).sum(dim=1)  # [n]
    total = int(tokens.sum())
    alpha = float(sums.sum() / total) if total else float("nan")
    return alpha, PromptSums(tuple(tokens.tolist()), tuple(round(x, 6) for x in sums.tolist()))
