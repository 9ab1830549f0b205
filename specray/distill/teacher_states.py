"""Online KD's teacher side, computed once per run for the rows whose response never changes.

An online micro-batch mixes rows of three sources (`data.row_sources`): student samples (new every step),
the dataset's ground truth and the teacher's responses from the τ_kd shard. The last two are the same
tokens whenever the row plan draws them again, so the teacher's forward pass over them — most of an online
step's cost (benchmarks/README.md) — need run only once. `StaticStates` runs it at setup, over every such
row this rank will train on, and keeps the teacher's *final hidden states at the response positions*
([response, hidden] per row: smaller than logits whenever hidden < vocab); the loss applies the teacher's
LM head to them (`ResponseLoss(teacher_states=...)`), exactly what it does to a fresh forward's states.

Determinism: the rows are computed in one canonical order and batching, whatever step the run starts
from, so a resumed run uses the very states of an uninterrupted one. The values equal a per-step forward's
up to fp round-off (the padding of the batch differs), like `distill.loss_chunk_size`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel

from specray.devices import autocast
from specray.distill.data import TrainRow, collate
from specray.distill.losses import IGNORE_INDEX, final_hidden_states

log = logging.getLogger(__name__)

BYTES_PER_MB = 2**20


def response_states(teacher: PreTrainedModel, rows: Sequence[TrainRow], pad_token_id: int) -> list[Tensor]:
    """The teacher's final hidden states at each row's response positions: [len(response), hidden] each."""
    device = next(teacher.parameters()).device
    batch = collate(rows, pad_token_id).to(device)
    counted = batch.labels != IGNORE_INDEX  # [batch, seq]; row i counts len(rows[i].response_ids)
    with torch.no_grad(), autocast(device):
        hidden = final_hidden_states(teacher, batch.input_ids, batch.attention_mask)[counted]  # [counted, h]
    return list(hidden.split([len(row.response_ids) for row in rows]))


def _canonical(rows: Iterable[TrainRow]) -> list[TrainRow]:
    """Each row once, by length (little padding per batch), then tokens: the same order on every run."""
    return sorted(
        set(rows), key=lambda r: (len(r.prompt_ids) + len(r.response_ids), r.prompt_ids, r.response_ids)
    )


def estimated_mb(rows: Iterable[TrainRow], hidden_size: int) -> float:
    """fp32 megabytes that the states of `rows` take."""
    return sum(len(row.response_ids) for row in set(rows)) * hidden_size * 4 / BYTES_PER_MB


class StaticStates:
    """The teacher's response states of a fixed set of rows, computed at construction, `batch_size` rows
    per forward pass."""

    def __init__(
        self, teacher: PreTrainedModel, rows: Iterable[TrainRow], pad_token_id: int, batch_size: int
    ) -> None:
        ordered = _canonical(rows)
        self.states: dict[TrainRow, Tensor] = {}
        for start in range(0, len(ordered), batch_size):
            chunk = ordered[start : start + batch_size]
            self.states.update(zip(chunk, response_states(teacher, chunk, pad_token_id), strict=True))

    def __len__(self) -> int:
        return len(self.states)

    def for_batch(self, teacher: PreTrainedModel, rows: Sequence[TrainRow], pad_token_id: int) -> Tensor:
        """[counted, hidden] for a micro-batch's rows, in `collate`'s row-major order of counted positions:
        kept states where there are some, one forward pass over the other rows (student samples)."""
        fresh = [row for row in rows if row not in self.states]
        computed = (
            dict(zip(fresh, response_states(teacher, fresh, pad_token_id), strict=True)) if fresh else {}
        )
        return torch.cat([self.states[row] if row in self.states else computed[row] for row in rows])
