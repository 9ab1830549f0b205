"""The distillation losses: tiny pure functions (torchtune style) and the loss module of the train loop.

Shape contract: logits [batch, seq, vocab] and `labels` [batch, seq] are already aligned — `labels[:, t]`
is the token that `logits[:, t]` predicts, and IGNORE_INDEX marks positions that do not count (the prompt
and the padding; see `data.collate`). Averages are over the counted positions, per token or per sequence
(`specray.ops.masked_sum`), computed in at least fp32; 0.0 when none count.

Memory at a large vocabulary. Plain, a micro-batch materialises the student's and the teacher's logits,
[batch, seq, vocab] each, plus several fp32 tensors of that shape inside the divergence that autograd keeps
for the backward pass: at a 32k vocabulary and 8 × 512 tokens that is 0.5 GB per tensor. `ResponseLoss`
with a `chunk_size` never builds them: it takes the models' final hidden states ([batch, seq, hidden], small),
keeps the counted positions, and applies each LM head to `chunk_size` positions at a time — the teacher's
under no_grad, the student's under activation checkpointing, so the backward pass recomputes one chunk's
logits at a time. The values equal the plain path's up to fp round-off (tests/unit/test_distill_losses.py).
It takes that path for every micro-batch, one chunk or many: the heads then never run on prompt positions,
which are most of a row when prompts are long and responses short.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, cast

import torch
from torch import Tensor

from specray.ops import (
    Averaging,
    averaging_units,
    chunked_rows,
    get_per_token_divergence,
    masked_sum,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

IGNORE_INDEX = -100


def _spread(values: Tensor, counted: Tensor) -> Tensor:
    """Per-token values of the counted positions [counted] back in place: [batch, seq], 0 elsewhere."""
    zeros = torch.zeros(counted.shape, dtype=values.dtype, device=values.device)
    return zeros.masked_scatter(counted, values)


def response_cross_entropy_sum(
    student_logits: Tensor, labels: Tensor, averaging: Averaging = "token"
) -> tuple[Tensor, Tensor]:
    """(sum, units) of `response_cross_entropy`: sum / units is the mean (`ops.masked_sum`)."""
    counted = labels != IGNORE_INDEX  # [batch, seq]
    # select first, then upcast: only response positions are materialised in fp32
    per_token = torch.nn.functional.cross_entropy(
        student_logits[counted].float(), labels[counted], reduction="none"
    )
    return masked_sum(_spread(per_token, counted), counted, averaging)


def response_cross_entropy(student_logits: Tensor, labels: Tensor, averaging: Averaging = "token") -> Tensor:
    """SeqKD (offline, black-box): cross-entropy of the student on the teacher's response tokens.

    student_logits: [batch, seq, vocab]; labels: [batch, seq] with IGNORE_INDEX on prompt and padding
    -> scalar. Logits at ignored positions never enter the sum, whatever their value.
    """
    total, units = response_cross_entropy_sum(student_logits, labels, averaging)
    return total / units.clamp(min=1)


def per_token_divergence(
    divergence: str, temperature: float = 1.0, jsd_beta: float = 0.5
) -> Callable[..., Tensor]:
    """The divergence `divergence` at each position, [..., vocab] x 2 (student, teacher) -> [...]; `jsd_beta`
    is used by jsd only. An unknown name lists the valid ones."""
    extra = {"beta": jsd_beta} if divergence == "jsd" else {}
    return functools.partial(get_per_token_divergence(divergence), temperature=temperature, **extra)


def distillation_divergence_sum(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    divergence: str,
    temperature: float = 1.0,
    jsd_beta: float = 0.5,
    averaging: Averaging = "token",
) -> tuple[Tensor, Tensor]:
    """(sum, units) of `distillation_divergence`: sum / units is the mean (`ops.masked_sum`)."""
    per_token = per_token_divergence(divergence, temperature, jsd_beta)(student_logits, teacher_logits)
    return masked_sum(per_token, labels != IGNORE_INDEX, averaging)  # per_token: [batch, seq]


def distillation_divergence(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    divergence: str,
    temperature: float = 1.0,
    jsd_beta: float = 0.5,
    averaging: Averaging = "token",
) -> Tensor:
    """Online KD (white-box): divergence between teacher P and student Q on the response positions.

    student_logits, teacher_logits: [batch, seq, vocab]; labels: [batch, seq] (only its IGNORE_INDEX
    pattern is used: the response tokens themselves may come from the teacher or the student) -> scalar.
    `divergence` is one of specray.ops.DIVERGENCES (fkl, rkl, jsd, tvd); `jsd_beta` is used by jsd only.
    """
    options = (divergence, temperature, jsd_beta, averaging)
    total, units = distillation_divergence_sum(student_logits, teacher_logits, labels, *options)
    return total / units.clamp(min=1)


# ---------------------------------------------------------------- the train loop's loss module


def unwrap(model: torch.nn.Module) -> PreTrainedModel:
    """The HF model itself: DDP keeps the model it wraps in `.module`."""
    return cast("PreTrainedModel", getattr(model, "module", model))


def final_hidden_states(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """[batch, seq, hidden]: what the model's LM head would see, without computing any logits.

    Calls `model` itself (not its inner decoder), so DDP's forward hooks still run. An empty
    `logits_to_keep` makes transformers' causal LMs apply their head to no position at all.
    """
    keep_none = torch.zeros(0, dtype=torch.long, device=input_ids.device)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        use_cache=False,
        output_hidden_states=True,
        logits_to_keep=keep_none,
    )
    return out.hidden_states[-1]  # transformers puts the final (normed) hidden state last


def check_chunkable(model: torch.nn.Module) -> None:
    """ValueError unless the model's logits are its output embeddings applied to its final hidden state
    (Llama, Mistral, Qwen...); models that scale or soft-cap logits after the head cannot be chunked."""
    unwrapped = unwrap(model)
    device = next(unwrapped.parameters()).device
    tokens = torch.arange(4, device=device).view(1, 4) % unwrapped.config.vocab_size  # [1, 4]
    ones = torch.ones_like(tokens)
    head, training = unwrapped.get_output_embeddings(), unwrapped.training
    unwrapped.eval()  # no dropout: the two forwards must see the same network
    with torch.no_grad():
        logits = unwrapped(input_ids=tokens, attention_mask=ones, use_cache=False).logits
        same = head is not None and torch.allclose(
            head(final_hidden_states(unwrapped, tokens, ones)), logits, rtol=1e-4, atol=1e-5
        )
    unwrapped.train(training)
    if not same:
        raise ValueError(
            f"distill.loss_chunk_size: the logits of {type(unwrapped).__name__} are not its output "
            "embeddings applied to its last hidden state, so its loss cannot be chunked; "
            "set distill.loss_chunk_size=0"
        )


class _Inputs(NamedTuple):
    """A micro-batch as `ResponseLoss` takes it (see its `__call__`)."""

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor
    states: Tensor | None


@dataclass(frozen=True)
class ResponseLoss:
    """The loss of one micro-batch, either paradigm, as a sum over averaging units (see `units`).

    `divergence` None = offline cross-entropy on the labels (`response_cross_entropy_sum`); else the online
    divergence between the teacher and the student (`distillation_divergence_sum`). `chunk_size` 0 = the
    plain path: the full logits, then those functions. `chunk_size` > 0 = the chunked path for every
    micro-batch (see the module docstring): the LM heads run on the counted positions only, `chunk_size`
    of them at a time (one chunk when there are fewer); the same values up to fp round-off.
    """

    divergence: str | None = None
    temperature: float = 1.0
    jsd_beta: float = 0.5
    averaging: Averaging = "token"
    chunk_size: int = 0

    def units(self, labels: Tensor) -> int:
        """What the sum is a sum over: counted tokens, or sequences with a counted token."""
        return int(averaging_units(labels != IGNORE_INDEX, self.averaging))

    def __call__(
        self,
        student: torch.nn.Module,
        teacher: torch.nn.Module | None,
        input_ids: Tensor,
        attention_mask: Tensor,
        labels: Tensor,
        teacher_states: Tensor | None = None,
    ) -> Tensor:
        """Sum of the loss over this micro-batch's units (mean × `units`), with the student's grad.

        input_ids, attention_mask, labels: [batch, seq] (as `data.collate` makes them) -> scalar.
        teacher_states: [counted, hidden], the teacher's final hidden states at the counted positions in
        row-major order (`teacher_states.response_states`), computed beforehand: the teacher is then not
        run, only its LM head (online only; the teacher's logits must be its head on them, as chunking
        requires).
        """
        inputs = _Inputs(input_ids, attention_mask, labels, teacher_states)
        if self.chunk_size > 0:
            return self._chunked(student, teacher, inputs)
        return self._plain(student, teacher, inputs)

    def _per_token(self) -> Callable[..., Tensor]:
        """The divergence at each position: [..., vocab] x 2 -> [...]."""
        assert self.divergence is not None
        return per_token_divergence(self.divergence, self.temperature, self.jsd_beta)

    def _plain(self, student, teacher, inputs: _Inputs) -> Tensor:
        input_ids, attention_mask, labels, states = inputs
        logits = student(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        if self.divergence is None:
            return response_cross_entropy_sum(logits, labels, self.averaging)[0]
        assert teacher is not None, "online distillation needs the teacher"
        if states is not None:
            counted = labels != IGNORE_INDEX  # [batch, seq]
            with torch.no_grad():
                teacher_logits = unwrap(teacher).get_output_embeddings()(states)  # [counted, vocab]
            per_token = _spread(self._per_token()(logits[counted], teacher_logits), counted)
            return masked_sum(per_token, counted, self.averaging)[0]
        with torch.no_grad():
            teacher_logits = teacher(input_ids=input_ids, attention_mask=attention_mask).logits
        options = (self.divergence, self.temperature, self.jsd_beta, self.averaging)
        return distillation_divergence_sum(logits, teacher_logits, labels, *options)[0]

    def _chunked(self, student, teacher, inputs: _Inputs) -> Tensor:
        input_ids, attention_mask, labels, states = inputs
        counted = labels != IGNORE_INDEX  # [batch, seq]
        hidden = final_hidden_states(student, input_ids, attention_mask)[counted]  # [counted, hidden]
        head = unwrap(student).get_output_embeddings()
        if self.divergence is None:

            def ce_loss(h: Tensor, targets: Tensor) -> Tensor:  # [chunk, hidden], [chunk] -> [chunk]
                return torch.nn.functional.cross_entropy(head(h).float(), targets, reduction="none")

            per_token = chunked_rows(ce_loss, (hidden, labels[counted]), self.chunk_size)
        else:
            assert teacher is not None, "online distillation needs the teacher"
            teacher_hidden = states
            if teacher_hidden is None:
                with torch.no_grad():
                    teacher_hidden = final_hidden_states(teacher, input_ids, attention_mask)[counted]
            teacher_head, divergence = unwrap(teacher).get_output_embeddings(), self._per_token()

            def kd_loss(h: Tensor, teacher_h: Tensor) -> Tensor:  # [chunk, hidden] x 2 -> [chunk]
                with torch.no_grad():
                    teacher_logits = teacher_head(teacher_h)
                return divergence(head(h), teacher_logits)

            per_token = chunked_rows(kd_loss, (hidden, teacher_hidden), self.chunk_size)
        return masked_sum(_spread(per_token, counted), counted, self.averaging)[0]
