"""Mixtures of τ_kd shards and the per-step row plan: weights, determinism, epochs, rank slices."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from specray.distill.data import (
    MixtureSampler,
    TrainRow,
    normalise,
    onpolicy_indices,
    plan_draws,
    rank_slice,
)

SIZES = {0.0: 50, 0.5: 70, 1.0: 30}


def test_normalised_weights_sum_to_one_and_bad_mixtures_are_refused() -> None:
    assert normalise({1.0: 3, 0.5: 1}) == {0.5: 0.25, 1.0: 0.75}
    for bad in ({}, {0.5: 0.0}, {0.5: -1.0}):
        with pytest.raises(ValueError, match="weights > 0"):
            normalise(bad)


def test_draws_follow_the_mixture_weights() -> None:
    mixture = {0.0: 1.0, 0.5: 2.0, 1.0: 3.0}
    count = 6000
    taus = Counter(tau for tau, _ in plan_draws(mixture, SIZES, count, seed=0))
    for tau, weight in normalise(mixture).items():
        sigma = math.sqrt(weight * (1 - weight) / count)
        assert abs(taus[tau] / count - weight) < 4 * sigma, (tau, taus[tau] / count, weight)


def test_draws_are_seeded_and_deterministic() -> None:
    mixture = {0.0: 1.0, 1.0: 1.0}
    assert plan_draws(mixture, SIZES, 500, seed=3) == plan_draws(mixture, SIZES, 500, seed=3)
    assert plan_draws(mixture, SIZES, 500, seed=3) != plan_draws(mixture, SIZES, 500, seed=4)
    # weights written differently but equal once normalised give the same plan
    assert plan_draws({0.0: 2.0, 1.0: 2.0}, SIZES, 500, seed=3) == plan_draws(mixture, SIZES, 500, seed=3)


def test_each_shard_is_read_in_shuffled_epochs() -> None:
    draws = plan_draws({0.5: 1.0}, SIZES, 2 * SIZES[0.5] + 5, seed=0)
    rows = [row for _, row in draws]
    assert sorted(rows[:70]) == list(range(70)) and sorted(rows[70:140]) == list(range(70))
    assert rows[:70] != rows[70:140] and rows[:70] != list(range(70))
    assert {tau for tau, _ in draws} == {0.5}  # a single τ_kd is the mixture {τ: 1}


def test_micro_batches_partition_the_plan_and_are_rebuilt_identically() -> None:
    rows = {tau: [TrainRow((tau, i), (i,), tau) for i in range(n)] for tau, n in SIZES.items()}
    mixture = {0.0: 1.0, 1.0: 1.0}
    sampler = MixtureSampler(rows, mixture, steps=3, batch_size=4, grad_accum=2, seed=0)
    batches = [sampler.micro_batch(step, micro) for step in (1, 2, 3) for micro in (0, 1)]
    assert [r.prompt_ids for b in batches for r in b] == [(tau, i) for tau, i in sampler.draws]
    again = MixtureSampler(rows, mixture, steps=3, batch_size=4, grad_accum=2, seed=0)
    assert again.micro_batch(2, 1) == sampler.micro_batch(2, 1)  # what a resumed run rebuilds


def test_onpolicy_rows_are_exactly_lambda_b_and_rank_slices_cover_the_batch() -> None:
    assert onpolicy_indices(16, 0.5, 0, 1, 0) == onpolicy_indices(16, 0.5, 0, 1, 0)
    assert len(onpolicy_indices(16, 0.5, 0, 1, 0)) == 8
    assert onpolicy_indices(16, 0.5, 0, 1, 0) != onpolicy_indices(16, 0.5, 0, 2, 0)
    assert onpolicy_indices(16, 0.0, 0, 1, 0) == set() and onpolicy_indices(5, 1.0, 0, 1, 0) == set(range(5))
    slices = [list(rank_slice(7, rank, 3)) for rank in range(3)]
    assert sorted(sum(slices, [])) == list(range(7)) and [len(s) for s in slices] == [3, 2, 2]
