"""Target continuations for the analytic estimator: sampled once per (test set, τ_dec), then cut into
teacher-forced batches whose warped next-token distributions each model is scored with.

The samples do not depend on the batch size: prompt i draws from its own generator, seeded by (seed, i),
on the model's device. A forced batch holds prompt + response right-padded, with, per response token, the
position whose logits predict it, so a model's response distributions come from one forward pass
(`response_probs`). The estimator (`analytic.py`) scores drafts along them; the evaluator
(`evaluator.py`) samples them and keeps their responses in its disk cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from specray.ops import warp
from specray.sampling import sample_batch
from specray.seeds import prompt_seed

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Continuations:
    """Target samples for one (test set, τ_dec): prompt token ids and the sampled response ids, and,
    when they were sampled in this process with `keep_logits`, the target's raw logits at every response
    position (one [len(response), vocab] tensor per response; never written to the disk cache)."""

    tau: float
    prompts: list[list[int]]
    responses: list[list[int]]
    target_logits: list[Tensor] | None = field(default=None, compare=False, repr=False)


class ForcedBatch(NamedTuple):
    """Right-padded prompt + response sequences of some continuations, for one teacher-forced pass."""

    input_ids: Tensor  # [batch, L]
    attention_mask: Tensor  # [batch, L]
    positions: Tensor  # [batch, T]: for response token t, the position whose logits predict it
    valid: Tensor  # [batch, T] bool: False on padding
    rows: list[int]  # the sequences' indices in the continuations


def sample_continuations(
    target: PreTrainedModel,
    prompts: list[list[int]],
    tau: float,
    max_new_tokens: int,
    eos_token_id: int | None,
    seed: int,
    pad_token_id: int = 0,
    batch_size: int = 32,
    keep_logits: bool = True,
) -> Continuations:
    """One target sample per prompt at τ, batched with a KV cache (optionally keeping the logits they
    were drawn from). The i-th prompt draws from its own generator seeded by (seed, i), created on the
    model's device, so the samples do not depend on the batch size; prompts are batched in order of
    length, so a batch pads little."""
    device = target.device
    eos = {eos_token_id} if eos_token_id is not None else set()
    responses: list[list[int]] = [[] for _ in prompts]
    logits: list[Tensor] = [torch.empty(0) for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        generators = [torch.Generator(device=device).manual_seed(prompt_seed(seed, i)) for i in chunk]
        samples = sample_batch(
            target,
            [prompts[i] for i in chunk],
            [tau] * len(chunk),
            generators,
            max_new_tokens,
            eos,
            pad_token_id,
            keep_logits=keep_logits,
        )
        for i, sample in zip(chunk, samples, strict=True):
            responses[i] = sample.token_ids
            if sample.logits is not None:  # kept only with keep_logits
                logits[i] = sample.logits
    return Continuations(tau, prompts, responses, logits if keep_logits else None)


def forced_batches(continuations: Continuations, batch_size: int, pad_id: int) -> list[ForcedBatch]:
    """The continuations as right-padded batches (sequences in order of length, empty responses left out)."""
    pairs = list(enumerate(zip(continuations.prompts, continuations.responses, strict=True)))
    pairs = sorted((pair for pair in pairs if pair[1][1]), key=lambda pair: sum(map(len, pair[1])))
    return [
        _forced_batch(pairs[start : start + batch_size], pad_id) for start in range(0, len(pairs), batch_size)
    ]


def _forced_batch(pairs: list[tuple[int, tuple[list[int], list[int]]]], pad_id: int) -> ForcedBatch:
    length = max(len(p) + len(r) for _, (p, r) in pairs)
    span = max(len(r) for _, (_, r) in pairs)
    input_ids = torch.full((len(pairs), length), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    index = torch.zeros((len(pairs), span), dtype=torch.long)
    valid = torch.zeros((len(pairs), span), dtype=torch.bool)
    for row, (_, (prompt, response)) in enumerate(pairs):
        sequence = prompt + response
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention[row, : len(sequence)] = 1
        index[row, : len(response)] = torch.arange(len(response)) + len(prompt) - 1
        valid[row, : len(response)] = True
    return ForcedBatch(input_ids, attention, index, valid, [i for i, _ in pairs])


@torch.no_grad()
def response_probs(model: PreTrainedModel, batch: ForcedBatch, tau: float) -> Tensor:
    """Warped next-token distributions at every response position, on the model's device: [batch, T, vocab].
    The LM head runs only from the earliest response position on (`logits_to_keep`: the prompts' other
    positions never reach the vocabulary), and only the response positions go through the vocabulary
    softmax (the gather comes first)."""
    device = model.device
    first = int(batch.positions[batch.valid].min()) if bool(batch.valid.any()) else 0
    logits = model(
        input_ids=batch.input_ids.to(device),
        attention_mask=batch.attention_mask.to(device),
        logits_to_keep=batch.input_ids.shape[1] - first,  # positions first.. of every row
    ).logits
    index = (batch.positions.to(device) - first).clamp(min=0)[..., None].expand(-1, -1, logits.shape[-1])
    return warp(logits.gather(1, index), tau)
