"""The analytic acceptance estimator (Leviathan et al., 2023, Corollary 3.6).

Speculative decoding's output follows the target, so sampling continuations y ~ target at τ_dec once and
scoring them with the target's and each draft's next-token distributions gives, at every response
position t, the exact probability that a draft token there is accepted: β_t = Σ_v min(p_τ(v), q_τ(v)).
No accept coin, no batch-1 loop: it averages over the whole distribution instead of sampling it, and the
target's distributions (the expensive part) are shared by every draft. When the continuations were just
sampled, the target's distributions are the logits the samples were drawn from; continuations read back
from the disk cache get one teacher-forced target pass instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

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
    """Target samples for one (test set, τ_dec): prompt token ids and the sampled response ids, and,
    when they were sampled in this process, the target's raw logits at every response position
    (one [len(response), vocab] tensor per response; not written to the disk cache)."""

    tau: float
    prompts: list[list[int]]
    responses: list[list[int]]
    target_logits: list[Tensor] | None = field(default=None, compare=False, repr=False)


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
    """One target sample per prompt at τ, batched with a KV cache, keeping the logits they were drawn
    from. The i-th prompt draws from its own generator seeded by (seed, i), so the samples do not depend
    on the batch size; prompts are batched in order of length, so a batch pads little."""
    from specray.teacher.engines import sample_batch

    eos = {eos_token_id} if eos_token_id is not None else set()
    responses: list[list[int]] = [[] for _ in prompts]
    logits: list[Tensor] = [torch.empty(0) for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        generators = [torch.Generator().manual_seed(seed * 1_000_003 + i) for i in chunk]
        samples = sample_batch(
            target,
            [prompts[i] for i in chunk],
            [tau] * len(chunk),
            generators,
            max_new_tokens,
            eos,
            pad_token_id,
            keep_logits=True,
        )
        for i, sample in zip(chunk, samples, strict=True):
            responses[i], logits[i] = sample.token_ids, sample.logits
    return Continuations(tau, prompts, responses, logits)


def _teacher_forced_batches(continuations: Continuations, batch_size: int, pad_id: int):
    """Right-padded batches of prompt + response (sequences in order of length, empty responses left
    out); `index` [batch, T] gives, for response token t, the position whose logits predict it
    (len(prompt) − 1 + t), `valid` [batch, T] masks padding and `rows` lists the sequences' indices."""
    pairs = list(enumerate(zip(continuations.prompts, continuations.responses, strict=True)))
    pairs = sorted((pair for pair in pairs if pair[1][1]), key=lambda pair: sum(map(len, pair[1])))
    for start in range(0, len(pairs), batch_size):
        rows = [i for i, _ in pairs[start : start + batch_size]]
        chunk = [pair for _, pair in pairs[start : start + batch_size]]
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
        yield input_ids, attention, index, valid, rows


@torch.no_grad()
def _response_probs(model: PreTrainedModel, batch, tau: float) -> Tensor:
    """Warped next-token distributions at every response position: [batch, T, vocab]."""
    input_ids, attention, index, _, _ = batch
    logits = model(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device)).logits
    gathered = logits.gather(1, index.to(model.device)[..., None].expand(-1, -1, logits.shape[-1]))
    return warp(gathered, tau).cpu()


def _sampled_probs(logits: list[Tensor], batch, tau: float) -> Tensor:
    """The sampling-time logits of a batch's sequences, warped and right-padded to [batch, T, vocab]."""
    rows, span = batch[4], batch[3].shape[1]
    padded = [torch.nn.functional.pad(logits[i], (0, 0, 0, span - len(logits[i]))) for i in rows]
    return warp(torch.stack(padded), tau)


class AnalyticEstimator:
    """Holds the target's distributions along one set of continuations; scores any number of drafts."""

    def __init__(
        self, target: PreTrainedModel, continuations: Continuations, pad_id: int, batch_size: int = 16
    ):
        self.continuations = replace(continuations, target_logits=None)  # kept below as probabilities only
        self.batches = list(_teacher_forced_batches(continuations, batch_size, pad_id))
        # the target's distributions, kept as warped probabilities, [batch, T, vocab] per batch: the logits
        # the continuations were sampled from, or else one teacher-forced pass
        if continuations.target_logits is not None:
            self.target_probs = [
                _sampled_probs(continuations.target_logits, batch, continuations.tau)
                for batch in self.batches
            ]
        else:
            self.target_probs = [_response_probs(target, batch, continuations.tau) for batch in self.batches]

    def beta(self, draft: PreTrainedModel) -> tuple[Tensor, Tensor]:
        """β_t for every sequence with a non-empty response, in the continuations' order, and position,
        [n, T_max] (0 where invalid), and the valid mask."""
        betas, masks, rows = [], [], []
        for batch, p in zip(self.batches, self.target_probs, strict=True):
            q = _response_probs(draft, batch, self.continuations.tau)
            betas.append(token_acceptance(p, q) * batch[3])
            masks.append(batch[3])
            rows += batch[4]
        width = max(b.shape[1] for b in betas)
        pad = [(0, width - b.shape[1]) for b in betas]
        beta = torch.cat([torch.nn.functional.pad(b, w) for b, w in zip(betas, pad, strict=True)])
        mask = torch.cat([torch.nn.functional.pad(m, w) for m, w in zip(masks, pad, strict=True)])
        order = torch.tensor(rows).argsort()  # batches run in order of length; give the caller's order back
        return beta[order], mask[order]

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
