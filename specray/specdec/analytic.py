"""The analytic acceptance estimator (Leviathan et al., 2023, Corollary 3.6), streaming.

Speculative decoding's output follows the target, so sampling continuations y ~ target at τ_dec once
(`continuations.py`) and scoring them with the target's and each draft's next-token distributions gives,
at every response position t, the exact probability that a draft token there is accepted:
β_t = Σ_v min(p_τ(v), q_τ(v)).
No accept coin, no batch-1 loop: it averages over the whole distribution instead of sampling it.

Memory is O(batch), not O(test set): the continuations are cut into teacher-forced batches, and for each
batch the target's distributions are computed once and scored against every draft of the pass before the
next batch starts, so one target pass serves all of them and at most one batch of [batch, T, vocab]
distributions per model is alive (at a 32k vocabulary, 1,000 prompts × 128 tokens would otherwise be
~16 GB). Only β itself, [n, T] per draft, is kept. The training probe, which scores one draft many times on
a few prompts, may keep the target's batches instead (`keep_target`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specray import metrics as m
from specray.ops import (
    draft_stop_after_rejection,
    expected_block_counts,
    expected_block_efficiency,
    expected_target_calls,
    lenient_target,
    lenient_token_acceptance,
    sampled_token_acceptance,
    token_acceptance,
    warp,
)
from specray.ops.blocks import BlockCounts
from specray.specdec.continuations import Continuations, ForcedBatch, forced_batches, response_probs
from specray.specdec.records import StepCosts
from specray.specdec.results import AnalyticResult

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Betas:
    """One draft's acceptance along a set of continuations, in their order: β [n, T] (0 where invalid)
    and the valid mask [n, T]; a sequence with an empty response has an all-False row. `sampled` [n, T]:
    the acceptance of the sampled token itself, min(1, q(y_t) / p(y_t)) (`ops.sampled_token_acceptance`),
    from which the server-side counts are exact."""

    beta: Tensor
    mask: Tensor
    sampled: Tensor | None = None
    eos_stop: Tensor | None = (
        None  # [n, T]: P(a rejected proposal was the EOS), ops.draft_stop_after_rejection
    )
    # [n, T]: the entropy (nats) of the target's warped distribution p_τ at each position: how open the
    # target's next token is there, whatever the draft (DistillSpec's per-example view sorts prompts by it)
    target_entropy: Tensor | None = None

    def subset(self, count: int) -> Betas:
        """The first `count` sequences (the prompts the empirical estimator decodes)."""
        rows = [
            x[:count] if x is not None else None for x in (self.sampled, self.eos_stop, self.target_entropy)
        ]
        return Betas(self.beta[:count], self.mask[:count], *rows)


def _sampled_probs(logits: list[Tensor], batch: ForcedBatch, tau: float) -> Tensor:
    """The sampling-time logits of a batch's sequences, warped and right-padded to [batch, T, vocab]."""
    span = batch.valid.shape[1]
    padded = [torch.nn.functional.pad(logits[i], (0, 0, 0, span - len(logits[i]))) for i in batch.rows]
    return warp(torch.stack(padded), tau)


LeniencePoint = tuple[str | None, float]  # (lenience function, ε); (None, 1.0) = lossless
LOSSLESS: LeniencePoint = (None, 1.0)


def _score(
    p: Tensor, q: Tensor, batch: ForcedBatch, point: LeniencePoint, eos_id: int | None
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """β [batch, T], the sampled tokens' own acceptance and P(a rejected proposal was EOS) at one point.

    ε < 1: β_ε = Σ_v min(q, f(p, ε)) along the target's continuations — the exact acceptance given each
    prefix, but the prefixes follow the target rather than the lossy decoder's output, so it is exact at
    the first position only; the evaluator scores lossy cells along their own output (`lossy.py`). The
    sampled tokens' own acceptance has no lossy counterpart here (the outputs are not the target's), so
    the server-side counts follow β_ε instead."""
    function, epsilon = point
    if epsilon == 1.0:
        accept = token_acceptance(p, q)
        tokens = batch.input_ids.gather(1, batch.positions + 1)  # [batch, T]: the sampled response ids
        sampled = sampled_token_acceptance(p, q, tokens)
        relaxed = p
    else:
        assert function is not None, "a lossy point (ε < 1) needs a lenience function"
        accept = lenient_token_acceptance(p, q, function, epsilon)
        sampled, relaxed = None, lenient_target(p, function, epsilon)
    stop = draft_stop_after_rejection(relaxed, q, accept, eos_id) if eos_id is not None else None
    return accept, sampled, stop


@dataclass
class _Buffers:
    """One draft's per-sequence results at one lenience point, filled batch by batch: [n, T] each."""

    beta: Tensor
    sampled: Tensor
    stop: Tensor
    has_sampled: bool = True
    has_stop: bool = True

    @classmethod
    def empty(cls, n: int, width: int) -> _Buffers:
        beta, sampled, stop = (torch.zeros(n, width, dtype=torch.float32) for _ in range(3))
        return cls(beta, sampled, stop)

    def fill(self, batch: ForcedBatch, beta: Tensor, sampled: Tensor | None, stop: Tensor | None) -> None:
        rows, span, valid = torch.tensor(batch.rows), batch.valid.shape[1], batch.valid
        self.beta[rows, :span] = (beta.cpu() * valid).float()
        self.has_sampled &= sampled is not None
        self.has_stop &= stop is not None
        if sampled is not None:
            self.sampled[rows, :span] = (sampled.cpu() * valid).float()
        if stop is not None:
            self.stop[rows, :span] = (stop.cpu() * valid).float()

    def betas(self, mask: Tensor) -> Betas:
        sampled = self.sampled if self.has_sampled else None
        # the lossless β always had a stop row, all zero without an EOS id: keep that for its records
        return Betas(self.beta, mask, sampled, self.stop if self.has_stop or sampled is not None else None)


class AnalyticEstimator:
    """Target continuations for one (test set, τ_dec); scores drafts batch by batch (see the module doc)."""

    def __init__(
        self,
        target: PreTrainedModel,
        continuations: Continuations,
        pad_id: int,
        batch_size: int = 16,
        keep_target: bool = False,
        eos_id: int | None = None,
    ):
        self.target, self.continuations, self.eos_id = target, continuations, eos_id
        self.batches = forced_batches(continuations, batch_size, pad_id)
        self.keep_target = keep_target
        self._kept: dict[int, Tensor] = {}

    def _target_probs(self, i: int) -> Tensor:
        """[batch, T, vocab] of batch i: kept, from the sampling-time logits, or a teacher-forced pass."""
        if i in self._kept:
            return self._kept[i]
        c, batch = self.continuations, self.batches[i]
        if c.target_logits is not None:
            device = self.target.device
            probs = _sampled_probs(c.target_logits, batch, c.tau).to(device)
        else:
            probs = response_probs(self.target, batch, c.tau)
        if self.keep_target:
            self._kept[i] = probs
        return probs

    def betas(self, drafts: Sequence[PreTrainedModel]) -> list[Betas]:
        """β of every draft, from one pass over the continuations (one target pass for all of them)."""
        return [by_point[LOSSLESS] for by_point in self.lenient_betas(drafts, [LOSSLESS])]

    def lenient_betas(
        self, drafts: Sequence[PreTrainedModel], points: Sequence[LeniencePoint]
    ) -> list[dict[LeniencePoint, Betas]]:
        """β_ε of every draft at every lenience point (function, ε), from one pass over the continuations:
        per draft, {point: Betas}. (None, 1.0) is the lossless β."""
        n = len(self.continuations.prompts)
        width = max((b.valid.shape[1] for b in self.batches), default=0)
        buffers = [{point: _Buffers.empty(n, width) for point in points} for _ in drafts]
        mask = torch.zeros(n, width, dtype=torch.bool)
        entropy = torch.zeros(n, width, dtype=torch.float32)
        for i, batch in enumerate(self.batches):
            p = self._target_probs(i)  # [batch, T, vocab]
            rows, span = torch.tensor(batch.rows), batch.valid.shape[1]
            mask[rows, :span] = batch.valid
            # entr(0) = 0, so a one-hot (τ = 0) row has entropy 0 without a log of 0
            entropy[rows, :span] = (torch.special.entr(p.float()).sum(-1).cpu() * batch.valid).float()
            for by_point, draft in zip(buffers, drafts, strict=True):
                q = response_probs(draft, batch, self.continuations.tau).to(p.device)
                for point, out in by_point.items():
                    out.fill(batch, *_score(p, q, batch, point, self.eos_id))
                del q
            del p
        return [
            {point: replace(out.betas(mask), target_entropy=entropy) for point, out in by_point.items()}
            for by_point in buffers
        ]

    def beta(self, draft: PreTrainedModel) -> tuple[Tensor, Tensor]:
        """β [n, T] of one draft and the valid mask [n, T], in the continuations' order."""
        (result,) = self.betas([draft])
        return result.beta, result.mask

    def evaluate(
        self,
        draft: PreTrainedModel,
        gamma: int,
        costs: StepCosts,
        subset: int | None = None,
        max_new_tokens: int | None = None,
    ) -> AnalyticResult:
        (betas,) = self.betas([draft])
        return analytic_result(betas, gamma, costs, subset, max_new_tokens)


def analytic_result(
    betas: Betas,
    gamma: int,
    costs: StepCosts,
    subset: int | None = None,
    max_new_tokens: int | None = None,
) -> AnalyticResult:
    """Acceptance, block efficiency and modelled speedup at one γ from a draft's β (every γ from one β);
    `max_new_tokens` is the decoders' length limit the continuations were sampled with."""
    mask = betas.mask
    beta = betas.beta.double() * mask
    tokens = int(mask.sum())
    lengths = mask.sum(dim=1)
    reached = lengths > 0
    alpha = float(beta.sum() / tokens) if tokens else math.nan
    per_sequence = (beta.sum(dim=1)[reached] / lengths[reached]).mean() if reached.any() else math.nan
    per_position = (beta.sum(dim=0) / mask.sum(dim=0).clamp(min=1)).tolist()
    calls = expected_target_calls(beta, gamma, lengths)  # [n]
    total_calls = float(calls.sum())
    simulated = float(lengths.sum()) / total_calls if total_calls > 0 else math.nan
    head = betas.subset(subset if subset is not None else len(mask))
    head_tokens = head.mask.sum()
    eos_stop = betas.eos_stop.double() if betas.eos_stop is not None else None
    counts = expected_block_counts(_along(betas), lengths, gamma, max_new_tokens, eos_stop)
    server = _server_metrics(counts, lengths, reached, gamma)
    return AnalyticResult(
        acceptance_rate=alpha,
        acceptance_rate_ci95=ratio_ci95(beta.sum(dim=1)[reached], lengths[reached].double()),
        acceptance_rate_per_sequence=float(per_sequence),
        beta_per_position=per_position,
        block_efficiency=float(expected_block_efficiency(min(alpha, 1.0), gamma)) if tokens else math.nan,
        block_efficiency_simulated=simulated,
        **_speedups(costs, server, gamma),
        tokens=tokens,
        empirical_prompts_acceptance_rate=float(head.beta.double().sum() / head_tokens)
        if head_tokens
        else math.nan,
        empirical_prompts_acceptance_rate_ci95=_head_ci(head),
        per_prompt_tokens=lengths.tolist(),
        per_prompt_beta_sum=beta.sum(dim=1).tolist(),
        per_prompt_target_calls=(counts.steps * reached).tolist(),
        per_prompt_drafted=(counts.drafted * reached).tolist(),
        per_prompt_accepted=(counts.accepted * reached).tolist(),
        per_prompt_target_entropy=_mean_entropy(betas, lengths),
        **server,
    )


def _mean_entropy(betas: Betas, lengths: Tensor) -> list[float]:
    """Per prompt, the target's mean entropy over its response positions (0 for an empty response)."""
    if betas.target_entropy is None:
        return []
    total = (betas.target_entropy.double() * betas.mask).sum(dim=1)
    return (total / lengths.clamp(min=1)).tolist()


def _speedups(costs: StepCosts, server: dict, gamma: int) -> dict:
    """speedup_model with its interval at every batch size of `costs` (from the exact expected counts)."""
    e, d, length = (server[k] for k in (m.BLOCK_EFFICIENCY_SAMPLED, m.DRAFTED_PER_STEP, m.TOKENS_PER_DECODE))
    e_ci = server[m.BLOCK_EFFICIENCY_SAMPLED_CI95]
    e_ci = e_ci if math.isfinite(e_ci) else 0.0  # one sequence: no interval for E, the costs' still holds
    by_batch, by_batch_ci = {}, {}
    for b in costs.batch_sizes:
        by_batch[str(b)] = costs.speedup(e, gamma, b, d, length) if math.isfinite(e) else math.nan
        by_batch_ci[str(b)] = (
            costs.speedup_ci95(e, e_ci, gamma, b, d, length) if math.isfinite(e) else math.nan
        )
    first = str(costs.batch_sizes[0])
    return {
        m.SPEEDUP_MODEL: by_batch[first],
        m.SPEEDUP_MODEL_CI95: by_batch_ci[first],
        m.SPEEDUP_MODEL_BY_BATCH: by_batch,
        m.SPEEDUP_MODEL_BY_BATCH_CI95: by_batch_ci,
        m.COST_TERMS: asdict(costs.terms(gamma, costs.batch_sizes[0])),
    }


def _along(betas: Betas) -> Tensor:
    """The per-position acceptance the server-side counts follow: the sampled tokens' own when known."""
    chosen = betas.sampled if betas.sampled is not None else betas.beta
    return chosen.double() * betas.mask


def _server_metrics(counts: BlockCounts, lengths: Tensor, reached: Tensor, gamma: int) -> dict:
    """The expected server-side counts of the sequences that have a response, pooled (ratios of sums, as
    servers pool them)."""
    counts = BlockCounts(*(x[reached] for x in counts))
    lengths = lengths[reached]
    steps, drafted, accepted = (float(x.sum()) for x in (counts.steps, counts.drafted, counts.accepted))
    if not steps:
        return dict.fromkeys(
            (m.BLOCK_EFFICIENCY_SAMPLED, m.BLOCK_EFFICIENCY_SAMPLED_CI95, m.MEAN_ACCEPTANCE_LENGTH),
            math.nan,
        ) | {
            m.DRAFTED_PER_STEP: math.nan,
            m.TOKENS_PER_DECODE: math.nan,
            m.MEAN_ACCEPTANCE_LENGTH_CI95: math.nan,
            m.DRAFT_ACCEPTANCE: math.nan,
            m.DRAFT_ACCEPTANCE_CI95: math.nan,
            m.DRAFT_ACCEPTANCE_HF: math.nan,
            m.MEAN_ACCEPTANCE_LENGTH_HF: math.nan,
            m.ACCEPTANCE_PER_POSITION: [math.nan] * gamma,
        }
    return {
        m.BLOCK_EFFICIENCY_SAMPLED: float(lengths.sum()) / steps,
        m.BLOCK_EFFICIENCY_SAMPLED_CI95: ratio_ci95(lengths.double(), counts.steps),
        m.DRAFTED_PER_STEP: drafted / steps,
        m.TOKENS_PER_DECODE: float(lengths.double().mean()),
        m.MEAN_ACCEPTANCE_LENGTH: 1.0 + accepted / steps,
        m.MEAN_ACCEPTANCE_LENGTH_CI95: ratio_ci95(counts.accepted, counts.steps),
        m.MEAN_ACCEPTANCE_LENGTH_HF: 1.0 + (accepted - float(counts.eos_steps.sum())) / steps,
        m.DRAFT_ACCEPTANCE: accepted / drafted if drafted else math.nan,
        m.DRAFT_ACCEPTANCE_CI95: ratio_ci95(counts.accepted, counts.drafted),
        m.DRAFT_ACCEPTANCE_HF: (accepted - float(counts.eos_steps.sum())) / drafted if drafted else math.nan,
        m.ACCEPTANCE_PER_POSITION: (counts.accepted_at.sum(dim=0) / steps).tolist(),
    }


def _head_ci(head: Betas) -> float:
    lengths = head.mask.sum(dim=1)
    reached = lengths > 0
    return ratio_ci95(head.beta.double().sum(dim=1)[reached], lengths[reached].double())


def ratio_ci95(numerators: Tensor, denominators: Tensor) -> float:
    """95% half-width of Σa/Σb with (a_i, b_i) as independent clusters (delta method for a ratio)."""
    n = len(numerators)
    if n < 2 or float(denominators.sum()) == 0:
        return math.nan
    ratio = numerators.sum() / denominators.sum()
    residuals = (numerators - ratio * denominators) / denominators.mean()
    return float(1.96 * torch.sqrt((residuals**2).sum() / (n * (n - 1))))
