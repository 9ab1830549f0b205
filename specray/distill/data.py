"""Training rows from τ_kd shards: the mixture plan, on-policy row choice, and batch collation.

Every random choice here is a pure function of (seed, step, micro-batch, row): the global batch of any
step can be rebuilt from scratch. That is what makes three things trivial — resuming from a checkpoint
needs no data-iterator state, each DDP rank takes its slice of the same global batch (so N workers see
exactly the rows one worker sees), and runs are deterministic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specray.distill.losses import IGNORE_INDEX
from specray.seeds import derive_seed

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class TrainRow:
    """One prompt and a response to learn from: a teacher response from the τ_kd shard, or (online) a
    student sample at that τ_kd or the dataset's ground truth. `response_ids` keeps the EOS the sampler
    emitted (a draft must learn to stop). `ground_truth_ids` is the prompt's ground-truth output tokenised
    as a response (EOS included), loaded only when a run trains on fixed data."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    tau_kd: float
    ground_truth_ids: tuple[int, ...] = ()


def generator(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*parts))


def rows_from_table(
    table: pa.Table,
    tau_kd: float,
    max_prompt_tokens: int,
    ground_truth: Mapping[str, tuple[int, ...]] | None = None,
) -> list[TrainRow]:
    """A shard's rows; prompts keep their last `max_prompt_tokens` tokens (the end of an Alpaca prompt,
    "### Response:", is what the response continues), as the evaluation does. `ground_truth` maps a
    prompt id to its ground-truth response tokens (fixed data), attached to the row."""
    ids = table.column("prompt_id").to_pylist()
    prompts = table.column("prompt_token_ids").to_pylist()
    responses = table.column("response_token_ids").to_pylist()
    truth = ground_truth or {}
    return [
        TrainRow(tuple(p[-max_prompt_tokens:]), tuple(r), tau_kd, truth.get(i, ()))
        for i, p, r in zip(ids, prompts, responses, strict=True)
        if p and r  # an empty response teaches nothing; an empty prompt has no position to predict from
    ]


def normalise(mixture: Mapping[float, float]) -> dict[float, float]:
    """Weights that sum to 1, by ascending τ_kd."""
    if not mixture or any(not w > 0 for w in mixture.values()):
        raise ValueError(f"a mixture needs at least one τ_kd and weights > 0, got {dict(mixture)}")
    total = sum(mixture.values())
    return {float(tau): weight / total for tau, weight in sorted(mixture.items())}


def plan_draws(
    mixture: Mapping[float, float], sizes: Mapping[float, int], count: int, seed: int
) -> list[tuple[float, int]]:
    """(τ_kd, row index) of each of `count` draws. The τ_kd of a draw is i.i.d. by the normalised weight;
    within a shard, rows are taken in shuffled epochs (every row once before any repeats)."""
    weights = normalise(mixture)
    taus = list(weights)
    probabilities = torch.tensor([weights[tau] for tau in taus], dtype=torch.float64)
    choices = torch.multinomial(probabilities, count, replacement=True, generator=generator(seed, "tau_kd"))
    counts = torch.bincount(choices, minlength=len(taus)).tolist()
    orders = {tau: _epochs(sizes[tau], n, seed, tau) for tau, n in zip(taus, counts, strict=True)}
    taken = dict.fromkeys(taus, 0)
    draws = []
    for choice in choices.tolist():
        tau = taus[choice]
        draws.append((tau, orders[tau][taken[tau]]))
        taken[tau] += 1
    return draws


def _epochs(size: int, count: int, seed: int, tau: float) -> list[int]:
    """The first `count` indices of consecutive random permutations of range(size)."""
    if size < 1:
        raise ValueError(f"the τ_kd={tau:g} shard has no usable rows")
    epochs = [
        torch.randperm(size, generator=generator(seed, "epoch", tau, e)) for e in range(-(-count // size))
    ]
    return torch.cat(epochs).tolist()[:count] if epochs else []


class MixtureSampler:
    """The global micro-batches of a run: `batch_size` rows per micro-batch, `grad_accum` per step; online
    (`sources`: the fractions λ1 of fixed data and λ2 of student samples), where each row's response
    comes from."""

    def __init__(
        self,
        rows: Mapping[float, Sequence[TrainRow]],
        mixture: Mapping[float, float],
        steps: int,
        batch_size: int,
        grad_accum: int,
        seed: int,
        sources: tuple[float, float] | None = None,
    ) -> None:
        missing = sorted(set(mixture) - set(rows))
        if missing:
            raise ValueError(f"no rows for τ_kd {missing} of the mixture")
        self.rows, self.batch_size, self.grad_accum = rows, batch_size, grad_accum
        self.steps, self.seed, self.sources = steps, seed, sources
        sizes = {tau: len(rows[tau]) for tau in mixture}
        self.draws = plan_draws(mixture, sizes, steps * grad_accum * batch_size, seed)

    def micro_batch(self, step: int, micro: int) -> list[TrainRow]:
        """The rows of micro-batch `micro` (0-based) of optimizer step `step` (1-based), all ranks."""
        start = ((step - 1) * self.grad_accum + micro) * self.batch_size
        return [self.rows[tau][index] for tau, index in self.draws[start : start + self.batch_size]]

    def planned(
        self, step: int, micro: int, rank: int = 0, world_size: int = 1
    ) -> tuple[list[TrainRow], list[int], list[int]]:
        """Global micro-batch `micro` of `step` (online: with its fixed-data rows' ground truth in place),
        this rank's indices into it, and which of those get a student sample (the same choice on every
        rank count)."""
        rows = self.micro_batch(step, micro)
        local = list(rank_slice(len(rows), rank, world_size))
        if self.sources is None:
            return rows, local, []
        sources = row_sources(len(rows), *self.sources, self.seed, step, micro)
        rows = with_ground_truth(rows, sources.fixed & set(local))
        return rows, local, sorted(sources.student & set(local))

    def static_rows(self, rank: int = 0, world_size: int = 1) -> tuple[list[TrainRow], set[tuple[int, ...]]]:
        """Every row of this rank's whole run whose response is not a student sample (with repeats), and
        the prompts of all of this rank's rows."""
        static: list[TrainRow] = []
        prompts: set[tuple[int, ...]] = set()
        for step in range(1, self.steps + 1):
            for micro in range(self.grad_accum):
                rows, local, chosen = self.planned(step, micro, rank, world_size)
                static.extend(rows[i] for i in local if i not in chosen)
                prompts.update(rows[i].prompt_ids for i in local)
        return static, prompts


@dataclass(frozen=True)
class RowSources:
    """Global row indices of one micro-batch by where their response comes from; every other row keeps
    its teacher response from the τ_kd shard."""

    fixed: frozenset[int]  # the dataset's ground truth
    student: frozenset[int]  # an on-policy student sample at the row's τ_kd


def row_sources(
    batch_size: int, fixed_fraction: float, student_fraction: float, seed: int, step: int, micro: int
) -> RowSources:
    """Exactly round(λ2·B) student rows and round((λ1 + λ2)·B) − round(λ2·B) fixed rows of a global
    micro-batch, at random positions (so every source spreads over the DDP ranks' slices).

    A pure function of (seed, step, micro): resume and DDP need no state. The student rows are the first
    of the same permutation `onpolicy_indices` always drew, so runs without fixed data keep their rows.
    """
    order = torch.randperm(batch_size, generator=generator(seed, "onpolicy", step, micro)).tolist()
    students = round(student_fraction * batch_size)
    # rounding the cumulative share keeps fixed + student <= B whatever the fractions' round-off
    either = min(batch_size, round((fixed_fraction + student_fraction) * batch_size))
    return RowSources(frozenset(order[students:either]), frozenset(order[:students]))


def onpolicy_indices(batch_size: int, fraction: float, seed: int, step: int, micro: int) -> set[int]:
    """Which rows of a global micro-batch are replaced by student samples: exactly round(λ·B) of them,
    chosen at random (so they spread over the DDP ranks' slices)."""
    return set(row_sources(batch_size, 0.0, fraction, seed, step, micro).student)


def with_ground_truth(rows: Sequence[TrainRow], chosen: Collection[int]) -> list[TrainRow]:
    """`rows` with the responses of the `chosen` indices replaced by their ground-truth outputs."""
    replaced = list(rows)
    for i in chosen:
        if not rows[i].ground_truth_ids:
            raise ValueError(
                f"row {i} has no ground-truth output: fixed data needs prepare_inputs to load it"
            )
        replaced[i] = dataclasses.replace(rows[i], response_ids=rows[i].ground_truth_ids)
    return replaced


def rank_slice(batch_size: int, rank: int, world_size: int) -> range:
    """Global row indices this rank trains on: strided, so every rank gets ⌊B/W⌋ or ⌈B/W⌉ rows."""
    return range(rank, batch_size, world_size)


@dataclass(frozen=True)
class Batch:
    """Right-padded prompt + response sequences.

    input_ids, attention_mask: [batch, seq]; labels: [batch, seq], aligned with the logits —
    labels[:, t] = input_ids[:, t + 1] where that token is a response token, else IGNORE_INDEX.
    """

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor

    @property
    def loss_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.labels.to(device))


def collate(rows: Sequence[TrainRow], pad_token_id: int) -> Batch:
    """One batch from rows; only response tokens are labelled (the prompt and padding are ignored)."""
    width = max(len(row.prompt_ids) + len(row.response_ids) for row in rows)
    input_ids, attention_mask, labels = [], [], []
    for row in rows:  # Python lists, then one tensor each: a step collates 16 rows, every step
        length, padding = len(row.prompt_ids) + len(row.response_ids), [pad_token_id] * width
        input_ids.append([*row.prompt_ids, *row.response_ids, *padding[length:]])
        attention_mask.append([1] * length + [0] * (width - length))
        # the logits at the prompt's last position predict the first response token, and so on
        ignored = [IGNORE_INDEX] * (len(row.prompt_ids) - 1)
        labels.append([*ignored, *row.response_ids, *[IGNORE_INDEX] * (width - length + 1)])
    tensors = (torch.tensor(x, dtype=torch.long) for x in (input_ids, attention_mask, labels))
    return Batch(*tensors)
