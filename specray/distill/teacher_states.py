"""Online KD's teacher side, computed once per run for the rows whose response never changes.

An online micro-batch mixes rows of three sources (`data.row_sources`): student samples (new every step),
the dataset's ground truth and the teacher's responses from the τ_kd shard. The last two are the same
tokens whenever the row plan draws them again, so the teacher's forward pass over them — a large part of
an online step's cost (benchmarks/README.md) — need run only once. `StaticStates` runs it at setup, over
every such row this rank will train on, and keeps the teacher's *final hidden states at the response
positions* ([response, hidden] per row: smaller than logits whenever hidden < vocab); the loss applies the
teacher's LM head to them (`ResponseLoss(teacher_states=...)`), exactly what it does to a fresh forward's
states.

The student's samples change every step, but their prompts do not: a prompt is often most of a row, and it
is the same prompt each time the row is drawn again.
`PromptStates` keeps the teacher's KV cache of every prompt a run will use (and the final hidden state at
its last position, which predicts the first response token), so a fresh row's forward pass runs over its
response only, attending to the kept keys and values (`cached_response_states`), a fraction of the full
pass's cost (benchmarks/README.md). Both kinds share `distill.teacher_cache_mb`: the
static rows' states first, the prompts' caches with what is left.

Determinism: the rows and prompts are computed in one canonical order and batching, whatever step the run
starts from, so a resumed run uses the very states of an uninterrupted one. The values equal a per-step
forward's up to fp round-off (the padding of the batch differs), like `distill.loss_chunk_size`; a model
whose cached pass does not match its full one (checked on the run's first rows) is never given the prompt
cache.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specray.devices import autocast
from specray.distill.data import TrainRow, collate
from specray.distill.losses import IGNORE_INDEX, final_hidden_states

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import PreTrainedModel

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


Prompt = tuple[int, ...]


class PromptStates:
    """The teacher's KV cache of each prompt (every layer's keys and values, [kv_heads, len, head_dim]) and
    its final hidden state at the prompt's last position ([hidden]); prompts of one length run together."""

    def __init__(self, teacher: PreTrainedModel, prompts: Iterable[Prompt], batch_size: int) -> None:
        self.kv: dict[Prompt, list[tuple[Tensor, Tensor]]] = {}
        self.last: dict[Prompt, Tensor] = {}
        by_length: dict[int, list[Prompt]] = {}
        for prompt in sorted(set(prompts), key=lambda p: (len(p), p)):
            by_length.setdefault(len(prompt), []).append(prompt)
        for same in by_length.values():  # no padding: each prompt's cache is its own forward's
            for start in range(0, len(same), batch_size):
                self._add(teacher, same[start : start + batch_size])

    def _add(self, teacher: PreTrainedModel, prompts: list[Prompt]) -> None:
        device = next(teacher.parameters()).device
        with torch.no_grad(), autocast(device):
            out = teacher(
                input_ids=torch.tensor(prompts, device=device),
                use_cache=True,
                output_hidden_states=True,
                logits_to_keep=torch.zeros(0, dtype=torch.long, device=device),  # no logits at all
            )
        layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        for i, prompt in enumerate(prompts):
            self.kv[prompt] = [(keys[i], values[i]) for keys, values in layers]
            self.last[prompt] = out.hidden_states[-1][i, -1]

    @staticmethod
    def estimated_mb(teacher: PreTrainedModel, prompts: Iterable[Prompt]) -> float:
        """What the caches of `prompts` would take: one short prompt's cache measured, its keys and values
        scaled to all the prompts' tokens, its last state to their number."""
        unique = sorted(set(prompts), key=lambda p: (len(p), p))
        if not unique:
            return 0.0
        one = PromptStates(teacher, unique[:1], batch_size=1)
        last = one.megabytes(keys_and_values=False)
        per_token = (one.megabytes() - last) / len(unique[0])
        return per_token * sum(len(p) for p in unique) + last * len(unique)

    def __len__(self) -> int:
        return len(self.kv)

    def __contains__(self, prompt: Prompt) -> bool:
        return prompt in self.kv

    def megabytes(self, keys_and_values: bool = True) -> float:
        tensors = list(self.last.values())
        if keys_and_values:
            tensors += [t for kv in self.kv.values() for pair in kv for t in pair]
        return sum(t.numel() * t.element_size() for t in tensors) / BYTES_PER_MB


def cached_response_states(
    teacher: PreTrainedModel, prompts: PromptStates, rows: Sequence[TrainRow], pad_token_id: int
) -> list[Tensor]:
    """`response_states` of rows whose prompts are all in `prompts`, running the teacher over the responses
    only. The kept prompt caches are left-padded to the longest ([batch, kv_heads, prompt, head_dim] per
    layer), the responses but their last token right-padded after them; positions count each row's own
    prompt, and the mask hides both paddings, so each row sees exactly its unpadded sequence."""
    from transformers import DynamicCache

    device = next(teacher.parameters()).device
    prompt_lens = [len(row.prompt_ids) for row in rows]
    forward_lens = [max(len(row.response_ids) - 1, 0) for row in rows]  # the last token predicts nothing
    width, span = max(prompt_lens), max(forward_lens)
    hidden: Tensor | None = None
    if span > 0:
        layers = len(prompts.kv[rows[0].prompt_ids])
        past = [
            tuple(
                torch.stack([_left_pad(prompts.kv[row.prompt_ids][layer][k], width) for row in rows])
                for k in (0, 1)
            )
            for layer in range(layers)
        ]
        input_ids = torch.full((len(rows), span), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width + span), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, : forward_lens[i]] = torch.tensor(row.response_ids[:-1], dtype=torch.long)
            mask[i, width - prompt_lens[i] : width + forward_lens[i]] = 1
        positions = torch.tensor(prompt_lens)[:, None] + torch.arange(span)[None, :]  # [batch, span]
        with torch.no_grad(), autocast(device):
            out = teacher(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                past_key_values=DynamicCache(past, config=teacher.config),
                use_cache=True,
                output_hidden_states=True,
                logits_to_keep=torch.zeros(0, dtype=torch.long, device=device),
            )
        hidden = out.hidden_states[-1]  # [batch, span, hidden]
    states = []
    for i, row in enumerate(rows):
        first = prompts.last[row.prompt_ids][None]  # [1, hidden]: the prompt's last position predicts token 0
        if not row.response_ids:
            states.append(first[:0])
        else:
            states.append(first if hidden is None else torch.cat([first, hidden[i, : forward_lens[i]]]))
    return states


def _left_pad(tensor: Tensor, width: int) -> Tensor:
    """[heads, len, dim] -> [heads, width, dim], zeros first (masked out)."""
    return torch.nn.functional.pad(tensor, (0, 0, width - tensor.shape[-2], 0))


def prompt_cache_matches(
    teacher: PreTrainedModel, prompts: PromptStates, rows: Sequence[TrainRow], pad_token_id: int
) -> bool:
    """Whether the cached pass gives the full pass's states on `rows` (a model whose forward does not take
    a cache this way — another attention layout, positions it computes itself — must not use it)."""
    full = torch.cat(response_states(teacher, rows, pad_token_id))
    cached = torch.cat(cached_response_states(teacher, prompts, rows, pad_token_id))
    # fp32 round-off, or bf16's (bf16 weights, or fp32 under bf16 autocast): read before the upcast below
    exact = full.dtype == cached.dtype == torch.float32 and not torch.is_autocast_enabled(full.device.type)
    tolerance = 1e-3 if exact else 5e-2
    full, cached = full.float(), cached.float()
    scale = float(full.abs().max().clamp(min=1.0))
    return full.shape == cached.shape and float((full - cached).abs().max()) <= tolerance * scale


class StaticStates:
    """The teacher's response states of a fixed set of rows, computed at construction, `batch_size` rows
    per forward pass; with `prompts` (covering every prompt), the rows and later fresh rows run through
    the prompts' kept caches."""

    def __init__(
        self,
        teacher: PreTrainedModel,
        rows: Iterable[TrainRow],
        pad_token_id: int,
        batch_size: int,
        prompts: PromptStates | None = None,
    ) -> None:
        ordered = _canonical(rows)
        self.prompts = prompts
        self.states: dict[TrainRow, Tensor] = {}
        for start in range(0, len(ordered), batch_size):
            chunk = ordered[start : start + batch_size]
            self.states.update(zip(chunk, self._compute(teacher, chunk, pad_token_id), strict=True))

    def __len__(self) -> int:
        return len(self.states)

    def _compute(self, teacher: PreTrainedModel, rows: Sequence[TrainRow], pad_token_id: int) -> list[Tensor]:
        if self.prompts is not None and all(row.prompt_ids in self.prompts for row in rows):
            return cached_response_states(teacher, self.prompts, rows, pad_token_id)
        return response_states(teacher, rows, pad_token_id)

    def for_batch(self, teacher: PreTrainedModel, rows: Sequence[TrainRow], pad_token_id: int) -> Tensor:
        """[counted, hidden] for a micro-batch's rows, in `collate`'s row-major order of counted positions:
        kept states where there are some, one forward pass over the other rows (student samples)."""
        fresh = [row for row in rows if row not in self.states]
        computed = dict(zip(fresh, self._compute(teacher, fresh, pad_token_id), strict=True)) if fresh else {}
        return torch.cat([self.states[row] if row in self.states else computed[row] for row in rows])


def kept_prompt_states(
    teacher: PreTrainedModel,
    prompts: set[tuple[int, ...]],
    rows: list[TrainRow],
    budget_mb: float,
    batch_size: int,
    pad_token_id: int,
) -> PromptStates | None:
    """The teacher's caches of `prompts` if they fit in `budget_mb` and the teacher's cached pass matches
    its full one on a few of the run's rows; else None (every fresh row then runs in full)."""
    needed = PromptStates.estimated_mb(teacher, prompts)
    if needed > budget_mb:
        log.info(
            "prompt caches need %.0f MB, %.0f MB left in distill.teacher_cache_mb: not kept",
            needed,
            budget_mb,
        )
        return None
    cache = PromptStates(teacher, prompts, batch_size)
    sample = [row for row in rows if row.response_ids][:4] or [
        TrainRow(prompt, prompt[-2:], 0.0) for prompt in sorted(prompts)[:4]
    ]
    if not prompt_cache_matches(teacher, cache, sample, pad_token_id):
        log.warning("the teacher's cached forward pass differs from its full one: prompt caches not used")
        return None
    return cache
