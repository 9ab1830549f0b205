"""The analytic acceptance estimator (Leviathan et al., 2023, Corollary 3.6).

Speculative decoding's output follows the target, so sampling continuations y ~ target at τ_dec once and
scoring them with one teacher-forced pass of the target and of each draft gives, at every response
position t, the exact probability that a draft token there is accepted: β_t = Σ_v min(p_τ(v), q_τ(v)).
No accept coin, no batch-1 loop: it averages over the whole distribution instead of sampling it, and the
target pass (the expensive one) is shared by every draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from specray.ops import (
    expected_block_efficiency,
    simulated_block_efficiency,
    speedup_model,
    token_acceptance,
    warp,
)


@dataclass(frozen=True)
class Continuations:
    """Target samples for one (test set, τ_dec): prompt token ids and the sampled response ids."""

    tau: float
    prompts: list[list[int]]
    responses: list[list[int]]


@dataclass(frozen=True)
class AnalyticResult:
    acceptance_rate: float  # mean β over every response position
    acceptance_rate_ci95: float  # half-width, sequences as clusters
    beta_per_position: list[float]  # mean β at response position t (over sequences that reach t)
    block_efficiency: float  # i.i.d. formula (1 − α^{γ+1}) / (1 − α)
    block_efficiency_simulated: float  # exact expectation over the per-position β of each sequence
    speedup_model: float  # block_efficiency_simulated / (c·γ + 1)
    tokens: int


def sample_continuations(
    target: PreTrainedModel,
    prompts: list[list[int]],
    tau: float,
    max_new_tokens: int,
    eos_token_id: int | None,
    seed: int,
    pad_token_id: int = 0,
    batch_size: int = 32,
) -> Continuations:
    """One target sample per prompt at τ, batched with a KV cache. The i-th prompt draws from its own
    generator seeded by (seed, i), so the samples do not depend on the batch size."""
    from specray.teacher.engines import sample_batch

    eos = {eos_token_id} if eos_token_id is not None else set()
    responses = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        generators = [torch.Generator().manual_seed(seed * 1_000_003 + start + i) for i in range(len(chunk))]
        samples = sample_batch(
            target, chunk, [tau] * len(chunk), generators, max_new_tokens, eos, pad_token_id
        )
        responses += [sample.token_ids for sample in samples]
    return Continuations(tau, prompts, responses)


def _teacher_forced_batches(continuations: Continuations, batch_size: int, pad_id: int):
    """Right-padded batches of prompt + response; `index` [batch, T] gives, for response token t, the
    position whose logits predict it (len(prompt) − 1 + t), and `valid` [batch, T] masks padding."""
    pairs = list(zip(continuations.prompts, continuations.responses, strict=True))
    for start in range(0, len(pairs), batch_size):
        chunk = [(p, r) for p, r in pairs[start : start + batch_size] if r]
        if not chunk:
            continue
        length = max(len(p) + len(r) for p, r in chunk)
        span = max(len(r) for _, r in chunk)
        input_ids = torch.full((len(chunk), length), pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        index = torch.zeros((len(chunk), span), dtype=torch.long)
        valid = torch.zeros((len(chunk), span), dtype=torch.bool)
        for row, (prompt, response) in enumerate(chunk):
            sequence = prompt + response
            input_ids[row, : len(sequence)] = torch.tensor(sequence)
            attention[row, : len(sequence)] = 1
            index[row, : len(response)] = torch.arange(len(response)) + len(prompt) - 1
            valid[row, : len(response)] = True
        yield input_ids, attention, index, valid


@torch.no_grad()
def _response_probs(model: PreTrainedModel, batch, tau: float) -> Tensor:
    """Warped next-token distributions at every response position: [batch, T, vocab]."""
    input_ids, attention, index, _ = batch
    logits = model(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device)).logits
    gathered = logits.gather(1, index.to(model.device)[..., None].expand(-1, -1, logits.shape[-1]))
    return warp(gathered, tau).cpu()


class AnalyticEstimator:
    """Holds the target's distributions along one set of continuations; scores any number of drafts."""

    def __init__(
        self, target: PreTrainedModel, continuations: Continuations, pad_id: int, batch_size: int = 16
    ):
        self.continuations = continuations
        self.batches = list(_teacher_forced_batches(continuations, batch_size, pad_id))
        # the one target pass: kept as warped probabilities, [batch, T, vocab] per batch
        self.target_probs = [_response_probs(target, batch, continuations.tau) for batch in self.batches]

    def beta(self, draft: PreTrainedModel) -> tuple[Tensor, Tensor]:
        """β_t for every sequence and position, [n, T_max] (0 where invalid), and the valid mask."""
        betas, masks = [], []
        for batch, p in zip(self.batches, self.target_probs, strict=True):
            q = _response_probs(draft, batch, self.continuations.tau)
            betas.append(token_acceptance(p, q) * batch[3])
            masks.append(batch[3])
        width = max(b.shape[1] for b in betas)
        pad = [(0, width - b.shape[1]) for b in betas]
        beta = torch.cat([torch.nn.functional.pad(b, w) for b, w in zip(betas, pad, strict=True)])
        mask = torch.cat([torch.nn.functional.pad(m, w) for m, w in zip(masks, pad, strict=True)])
        return beta, mask

    def evaluate(self, draft: PreTrainedModel, gamma: int, c: float) -> AnalyticResult:
        beta, mask = self.beta(draft)  # [n, T]
        tokens = int(mask.sum())
        alpha = float(beta.sum() / tokens)
        lengths = mask.sum(dim=1)
        per_position = (beta.sum(dim=0) / mask.sum(dim=0).clamp(min=1)).tolist()
        simulated = simulated_block_efficiency(beta, gamma, lengths)
        return AnalyticResult(
            acceptance_rate=alpha,
            acceptance_rate_ci95=ratio_ci95(beta.sum(dim=1), lengths.double()),
            beta_per_position=per_position,
            block_efficiency=float(expected_block_efficiency(min(alpha, 1.0), gamma)),
            block_efficiency_simulated=simulated,
            speedup_model=float(speedup_model(simulated, c, gamma)),
            tokens=tokens,
        )


def ratio_ci95(numerators: Tensor, denominators: Tensor) -> float:
    """95% half-width of Σa/Σb with (a_i, b_i) as independent clusters (delta method for a ratio)."""
    n = len(numerators)
    if n < 2 or float(denominators.sum()) == 0:
        return math.nan
    ratio = numerators.sum() / denominators.sum()
    residuals = (numerators - ratio * denominators) / denominators.mean()
    return float(1.96 * torch.sqrt((residuals**2).sum() / (n * (n - 1))))
