"""The two distillation losses, as tiny pure functions (torchtune style).

Shape contract (both): logits [batch, seq, vocab] and `labels` [batch, seq] are already aligned —
`labels[:, t]` is the token that `logits[:, t]` predicts, and IGNORE_INDEX marks positions that do not count
(the prompt and the padding; see `data.collate`). Each returns the mean over the counted positions
(0.0 when none count), computed in at least fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specray.ops import get_divergence

IGNORE_INDEX = -100


def response_cross_entropy(student_logits: Tensor, labels: Tensor) -> Tensor:
    """SeqKD (offline, black-box): cross-entropy of the student on the teacher's response tokens.

    student_logits: [batch, seq, vocab]; labels: [batch, seq] with IGNORE_INDEX on prompt and padding
    -> scalar. Logits at ignored positions never enter the sum, whatever their value.
    """
    counted = labels != IGNORE_INDEX  # [batch, seq]
    # select first, then upcast: only response positions are materialised in fp32
    per_token = torch.nn.functional.cross_entropy(
        student_logits[counted].float(), labels[counted], reduction="sum"
    )
    return per_token / counted.sum().clamp(min=1)


def distillation_divergence(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    divergence: str,
    temperature: float = 1.0,
    jsd_beta: float = 0.5,
) -> Tensor:
    """Online KD (white-box): divergence between teacher P and student Q on the response positions.

    student_logits, teacher_logits: [batch, seq, vocab]; labels: [batch, seq] (only its IGNORE_INDEX
    pattern is used: the response tokens themselves may come from the teacher or the student) -> scalar.
    `divergence` is one of specray.ops.DIVERGENCES (fkl, rkl, jsd, tvd); `jsd_beta` is used by jsd only.
    """
    function = get_divergence(divergence)
    extra = {"beta": jsd_beta} if divergence == "jsd" else {}
    return function(student_logits, teacher_logits, labels != IGNORE_INDEX, temperature, **extra)
