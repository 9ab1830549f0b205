"""The batched speculative decoder: lossless per row (statistical test) with rows of different prompt
lengths, greedy-exact against the batch-1 decoders, and counted per row."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare
from transformers import GPT2Config, GPT2LMHeadModel

from specray.specdec.batched import batched_autoregressive_decode, batched_speculative_decode
from specray.specdec.decoder import autoregressive_decode, speculative_decode
from tests.unit.test_specdec_decoder import VOCAB, exact_distribution, sharpened, tiny_llama

PROMPTS = [[1, 2, 3], [4], [5, 1, 2, 3, 4, 0], [2, 2]]  # different lengths: ragged from the prefill on


@pytest.fixture(scope="module")
def pair():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # models this small run fastest on one thread (and share a loaded machine best)
    yield tiny_llama(0), tiny_llama(1)
    torch.set_num_threads(threads)


def _index(tokens: list[int]) -> int:
    return sum(t * VOCAB ** (len(tokens) - 1 - i) for i, t in enumerate(tokens))


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value, cells expected below 5 pooled into one (when there are any)."""
    expected = probs / probs.sum() * counts.sum()
    small = expected < 5
    observed, wanted = [counts[~small]], [expected[~small]]
    if small.any():
        observed.append(counts[small].sum().reshape(1))
        wanted.append(expected[small].sum().reshape(1))
    return float(chisquare(torch.cat(observed).numpy(), torch.cat(wanted).numpy()).pvalue)


def tiny_gpt2(seed: int, sharpness: float = 6.0) -> GPT2LMHeadModel:
    """A random 1-layer GPT-2 over the same tiny vocabulary. Its positions are learned embeddings added to
    the input, so a token fed at the wrong position gets a clearly different distribution; under RoPE
    (`tiny_llama`) a position off by one moves a 1-layer model's distributions by a total variation of
    about 0.01 only, which 600 decodes cannot see."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=128)
    return sharpened(GPT2LMHeadModel(config).eval(), sharpness)


@pytest.fixture(scope="module")
def gpt2_pair():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_gpt2(0), tiny_gpt2(1)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("tau", [0.7, 1.0])
def test_every_row_of_a_batch_is_distributed_as_the_target(request, family: str, tau: float) -> None:
    """600 decodes of a batch of 4 prompts of different lengths, 2 tokens each at γ = 1: a row whose
    proposal is rejected takes a second step with no proposal while the others have finished, so rows go
    ragged. Each row's joint distribution matches the target's exact one for its own prompt, and clearly
    differs from the draft's (the test has power). The GPT-2 pair's absolute positions make a row fed at a
    shifted position fail (a planted `positions[0] += 1` after the prefill: p < 1e-20)."""
    target, draft = request.getfixturevalue("pair" if family == "llama" else "gpt2_pair")
    # 600 (was 1,200), measured over three seeds of the generators for every case: the draft's p-value
    # at most 4.5e-56 (threshold 1e-6); the planted position bug's 3e-146 at τ 0.7 and 7e-49 at τ 1. The
    # target's are uniform under the null at any n (these seeds: 0.020 to 0.85; with the seeds moved by one,
    # one row of 16 read 5.3e-4: a 1e-3 threshold over 16 rows fails about one seed set in 60, at any n)
    length, n = 2, 600
    counts = torch.zeros(len(PROMPTS), VOCAB**length, dtype=torch.float64)
    generators = [torch.Generator().manual_seed(1000 * r + int(tau * 10)) for r in range(len(PROMPTS))]
    for _ in range(n):
        decoded = batched_speculative_decode(target, draft, PROMPTS, tau, 1, length, None, generators)
        for r, row in enumerate(decoded):
            counts[r, _index(row.tokens)] += 1
    for r, prompt in enumerate(PROMPTS):
        assert chi_square_p(counts[r], exact_distribution(target, prompt, length, tau)) > 1e-3, r
        assert chi_square_p(counts[r], exact_distribution(draft, prompt, length, tau)) < 1e-6, r


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_batched_decodes_equal_each_rows_batch_one_decode(pair, gamma: int) -> None:
    target, draft = pair
    batched = batched_speculative_decode(target, draft, PROMPTS, 0.0, gamma, 24, None)
    plain = batched_autoregressive_decode(target, PROMPTS, 0.0, 24, None)
    for prompt, row, baseline in zip(PROMPTS, batched, plain, strict=True):
        alone = speculative_decode(target, draft, prompt, 0.0, gamma, 24, None)
        assert row.tokens == alone.tokens == baseline.tokens
        assert row.tokens == autoregressive_decode(target, prompt, 0.0, 24, None).tokens
        assert (row.stats.accepted, row.stats.target_calls) == (
            alone.stats.accepted,
            alone.stats.target_calls,
        )


def test_rows_stop_at_their_own_eos_and_leave_the_batch(pair) -> None:
    target, draft = pair
    greedy = [autoregressive_decode(target, p, 0.0, 30, None).tokens for p in PROMPTS]
    eos = greedy[0][4]  # a token the first row emits early
    batched = batched_speculative_decode(target, draft, PROMPTS, 0.0, 3, 30, eos)
    for row, full in zip(batched, greedy, strict=True):
        expected = full[: full.index(eos) + 1] if eos in full else full
        assert row.tokens == expected
        stats = row.stats
        assert stats.emitted == len(row.tokens) and stats.tested <= stats.drafted
        assert stats.emitted == stats.accepted + stats.target_calls  # one target token per step


def test_a_row_decodes_the_same_alone_or_in_a_batch(pair) -> None:
    """Per-row generators: a row's sampled output does not depend on the rows beside it."""
    target, draft = pair
    seeded = [torch.Generator().manual_seed(7 + r) for r in range(len(PROMPTS))]
    together = batched_speculative_decode(target, draft, PROMPTS, 1.0, 3, 16, None, seeded)
    alone = batched_speculative_decode(
        target, draft, PROMPTS[2:3], 1.0, 3, 16, None, [torch.Generator().manual_seed(9)]
    )
    assert together[2].tokens == alone[0].tokens


@pytest.mark.parametrize("batch_size", [1, 3])
def test_an_empirical_cell_keeps_per_prompt_sums_that_add_up_to_its_totals(pair, batch_size: int) -> None:
    from specray.specdec.empirical import run_empirical

    target, draft = pair
    result = run_empirical(target, draft, PROMPTS, 1.0, 3, 10, None, 2, seed=0, batch_size=batch_size)
    assert len(result.per_prompt_tokens) == len(PROMPTS) and sum(result.per_prompt_tokens) == result.tokens
    calls, accepted = sum(result.per_prompt_target_calls), sum(result.per_prompt_accepted)
    assert sum(result.per_prompt_tokens) / calls == pytest.approx(result.block_efficiency)
    assert 1 + accepted / calls == pytest.approx(result.mean_acceptance_length)
    assert accepted / sum(result.per_prompt_tested) == pytest.approx(result.acceptance_rate)
    assert accepted / sum(result.per_prompt_drafted) == pytest.approx(result.draft_acceptance)
    if batch_size == 1:  # each decode timed on its own
        speedup = sum(result.per_prompt_target_only_seconds) / sum(result.per_prompt_seconds)
        assert speedup == pytest.approx(result.speedup)
    else:  # a batch's time is its rows' together: no per-prompt seconds
        assert result.per_prompt_seconds == [] and result.per_prompt_target_only_seconds == []
