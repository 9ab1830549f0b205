"""Expected server-side counts from per-position acceptance (specray.ops.blocks): against a simulation of the
same step process, against the decoder's own counts where acceptance is deterministic (τ = 0), and the
sampled-token acceptance against its definition."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specray.ops import (
    expected_block_counts,
    sampled_token_acceptance,
    simulated_block_efficiency,
    token_acceptance,
    warp,
)
from specray.specdec.decoder import DecodeStats, speculative_decode


def simulate(
    beta: list[float], stop: list[float], length: int, gamma: int, limit: int, runs: int, seed: int
) -> list[float]:
    """Mean (steps, drafted, accepted, eos_steps, accepted ≥ 1, …) of the step process, written plainly:
    a proposal rejected at k was the EOS with probability stop[k] (the draft stops there), else the draft
    goes on to the output's end (or all d)."""
    rng = random.Random(seed)
    totals = [0.0] * (4 + gamma)
    for _ in range(runs):
        t = 0
        while t < length:
            d = max(0, min(gamma, limit - t - 1))
            e = min(d, length - t)
            k = 0
            while k < e and rng.random() < beta[t + k]:
                k += 1
            totals[0] += 1
            totals[2] += k
            for j in range(k):
                totals[4 + j] += 1
            if k == e and length < limit and e == length - t:  # the chain reached the EOS: the draft stopped
                totals[1] += e
                totals[3] += 1
                break
            totals[1] += (k + 1) if k < e and rng.random() < stop[t + k] else e
            t += k + 1
    return [x / runs for x in totals]


@pytest.mark.parametrize(
    ("length", "limit", "gamma"), [(10, 20, 3), (20, 20, 4), (7, 8, 3), (1, 5, 2), (5, 5, 4)]
)
def test_counts_match_a_simulation_of_the_steps(length: int, limit: int, gamma: int) -> None:
    generator = torch.Generator().manual_seed(length)
    beta = torch.rand(length, generator=generator) * 0.6 + 0.3
    stop = torch.rand(length, generator=generator) * 0.5
    counts = expected_block_counts(beta[None], torch.tensor([length]), gamma, limit, stop[None])
    exact = [float(x[0]) for x in counts[:4]] + counts.accepted_at[0].tolist()
    simulated = simulate(beta.tolist(), stop.tolist(), length, gamma, limit, runs=40_000, seed=length)
    # 40k runs: the simulated means are within ~1% (a count of at most 20 steps has sd < 3)
    assert exact == pytest.approx(simulated, rel=0.03, abs=0.02)


def test_steps_agree_with_the_simulated_block_efficiency() -> None:
    beta = torch.rand(3, 12, generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([12, 7, 1])
    counts = expected_block_counts(beta, lengths, 4)
    assert float(lengths.sum() / counts.steps.sum()) == pytest.approx(
        simulated_block_efficiency(beta, 4, lengths)
    )


def test_certain_acceptance_drafts_gamma_and_accepts_all() -> None:
    counts = expected_block_counts(torch.ones(1, 12), torch.tensor([12]), 3, max_new_tokens=12)
    # steps start at 0, 4, 8: the last drafts 3 (12 − 8 − 1) and the target's token ends the decode
    assert counts.steps.item() == 3 and counts.drafted.item() == 9 and counts.accepted.item() == 9
    assert counts.accepted_at[0].tolist() == [3, 3, 3] and counts.eos_steps.item() == 0


def test_an_accepted_chain_through_the_eos_ends_the_decode() -> None:
    """ℓ = 6 < M: the second step reaches the EOS at position 5 with 2 drafted tokens, all accepted."""
    counts = expected_block_counts(torch.ones(1, 6), torch.tensor([6]), 3, max_new_tokens=10)
    assert counts.steps.item() == 2 and counts.drafted.item() == 5 and counts.accepted.item() == 5
    assert counts.eos_steps.item() == 1  # HF counts one fewer accepted token: the EOS is its step's own


def tiny_llama(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


@torch.no_grad()
def test_greedy_counts_equal_the_decoders() -> None:
    """At τ = 0 acceptance is 0 or 1 along the target's greedy output: the expected counts are the decoder's
    counts exactly (steps, accepted, per position; drafted too unless the draft proposed an EOS that the
    target rejected, which does not happen here as no EOS is set)."""
    target, draft = tiny_llama(0), tiny_llama(1)
    for prompt in ([3, 5, 7], [11, 2], [9, 9, 9, 4]):
        decoded = speculative_decode(target, draft, prompt, 0.0, 3, 20, None)
        ids = torch.tensor([prompt + decoded.tokens])
        positions = torch.arange(len(prompt) - 1, ids.shape[1] - 1)
        p = warp(target(ids).logits[0, positions], 0.0)
        q = warp(draft(ids).logits[0, positions], 0.0)
        beta = token_acceptance(p, q)
        assert torch.equal(beta, sampled_token_acceptance(p, q, ids[0, positions + 1]))
        counts = expected_block_counts(beta[None], torch.tensor([len(decoded.tokens)]), 3, max_new_tokens=20)
        stats = decoded.stats
        assert (counts.steps.item(), counts.drafted.item(), counts.accepted.item()) == (
            stats.target_calls,
            stats.drafted,
            stats.accepted,
        )
        per_position = stats.accepted_per_position + [0] * (3 - len(stats.accepted_per_position))
        assert counts.accepted_at[0].tolist() == per_position


def test_sampled_token_acceptance_is_min_one_q_over_p_and_averages_to_beta() -> None:
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.tensor([[0.2, 0.6, 0.2]])
    a = sampled_token_acceptance(p.expand(3, 3), q.expand(3, 3), torch.tensor([0, 1, 2]))
    assert a.tolist() == pytest.approx([0.4, 1.0, 1.0])
    assert float((p[0] * a).sum()) == pytest.approx(float(token_acceptance(p, q)))  # E_{y~p}[a] = β


def test_decode_stats_add_per_position_counts() -> None:
    one, two = DecodeStats(), DecodeStats()
    one.count_step(2)
    two.count_step(3)
    two.count_step(0)
    assert (one + two).accepted_per_position == [2, 2, 1]
    assert (DecodeStats() + one).accepted_per_position == [1, 1]
