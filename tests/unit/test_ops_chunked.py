"""Chunked divergences equal the unchunked ones (values and gradients), and the two loss averagings.

Property tests (hypothesis) over shapes, masks, chunk sizes, temperatures and the four divergences; a
constructed example where token and sequence averaging differ by a known amount; a check that chunking
really keeps the fp32 [positions, vocab] intermediates out of the autograd graph.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specray.ops import (
    DIVERGENCES,
    averaging_units,
    chunked_rows,
    get_divergence,
    masked_average,
    masked_sum,
    total_variation,
)

FAST = settings(max_examples=25, deadline=None, database=None)
TOLERANCE = {"rtol": 1e-6, "atol": 1e-6}


@st.composite
def chunked_cases(draw: st.DrawFn) -> dict:
    """Logits [batch, seq, vocab] of student and teacher, a mask with at least one counted position in
    some rows (or none at all), a chunk size from 1 to beyond the number of positions."""
    batch, seq, vocab = draw(st.integers(1, 3)), draw(st.integers(1, 7)), draw(st.integers(2, 40))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.floats(0.1, 6.0))
    mask = torch.rand(batch, seq, generator=gen) < draw(st.floats(0.0, 1.0))
    return {
        "student": torch.randn(batch, seq, vocab, generator=gen) * scale,
        "teacher": torch.randn(batch, seq, vocab, generator=gen) * scale,
        "mask": mask,
        "chunk_size": draw(st.integers(1, batch * seq + 2)),
        "temperature": draw(st.sampled_from([0.5, 1.0, 2.0])),
        "averaging": draw(st.sampled_from(["token", "sequence"])),
    }


def _value_and_grads(name: str, case: dict, chunk_size: int) -> tuple[torch.Tensor, ...]:
    student = case["student"].clone().requires_grad_(True)
    teacher = case["teacher"].clone().requires_grad_(True)  # both roles must get the same gradient
    options = {"averaging": case["averaging"], "chunk_size": chunk_size}
    loss = get_divergence(name)(student, teacher, case["mask"], case["temperature"], **options)
    loss.backward()
    return loss.detach(), student.grad, teacher.grad


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
@FAST
@given(case=chunked_cases())
def test_chunked_divergence_equals_unchunked_with_gradients(name: str, case: dict) -> None:
    whole = _value_and_grads(name, case, chunk_size=0)
    chunked = _value_and_grads(name, case, chunk_size=case["chunk_size"])
    for expected, actual in zip(whole, chunked, strict=True):
        torch.testing.assert_close(actual, expected, **TOLERANCE)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_chunking_keeps_the_fp32_intermediates_out_of_the_graph(name: str) -> None:
    """Bytes autograd keeps for the backward pass: the unchunked divergence holds several fp32 [positions,
    vocab] tensors; the chunked one (checkpointed chunks) holds none of them, only small per-position ones."""
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(4, 64, 500, generator=gen).requires_grad_(True)  # 512 positions
    teacher = torch.randn(4, 64, 500, generator=gen)

    def saved_bytes(chunk_size: int) -> int:
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            get_divergence(name)(student, teacher, chunk_size=chunk_size)
        # memory of its own: views of the logits (the chunks) cost nothing, a storage counts once
        inputs = {student.untyped_storage().data_ptr(), teacher.untyped_storage().data_ptr()}
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
        return sum(size for pointer, size in storages.items() if pointer not in inputs)

    one_fp32_logits = student.numel() * 4
    assert saved_bytes(0) >= 2 * one_fp32_logits
    assert saved_bytes(64) < one_fp32_logits / 50


def test_chunked_rows_without_grad_and_bad_chunk_size() -> None:
    rows = torch.arange(10.0).view(5, 2)
    with torch.no_grad():
        out = chunked_rows(lambda x: x.sum(dim=-1), (rows,), chunk_size=2)
    assert out.tolist() == [1.0, 5.0, 9.0, 13.0, 17.0]
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_rows(lambda x: x, (rows,), chunk_size=-1)


# ---- token vs sequence averaging ----


def test_sequence_averaging_differs_from_token_averaging_by_the_known_amount() -> None:
    """Golden TVD 0.4 where student q = [0.9, 0.1] and teacher p = [0.5, 0.5] differ, 0 where equal.
    Response A has 1 token (TVD 0.4), response B has 3 tokens (0.4, 0, 0):
    token mean = 0.8 / 4 = 0.2; sequence mean = (0.4 + 0.4/3) / 2 = 4/15; they differ by 1/15."""
    p, q = torch.tensor([0.5, 0.5]).log(), torch.tensor([0.9, 0.1]).log()
    teacher = torch.stack([torch.stack([p, p, p, p]), torch.stack([p, p, p, p])])  # [2, 4, 2]
    student = teacher.clone()
    student[0, 0] = q  # A's only counted token
    student[1, 1] = q  # B's first counted token
    student[0, 2] = q  # not counted: must not matter
    mask = torch.tensor([[1, 0, 0, 0], [0, 1, 1, 1]], dtype=torch.bool)
    token = total_variation(student, teacher, mask, averaging="token").item()
    sequence = total_variation(student, teacher, mask, averaging="sequence").item()
    assert token == pytest.approx(0.2, rel=1e-6)
    assert sequence == pytest.approx(4 / 15, rel=1e-6)
    assert sequence - token == pytest.approx(1 / 15, rel=1e-5)


@FAST
@given(
    batch=st.integers(1, 4),
    seq=st.integers(1, 8),
    counted=st.integers(0, 8),
    seed=st.integers(0, 2**31 - 1),
)
def test_averagings_agree_when_every_response_has_the_same_length(batch, seq, counted, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    per_token = torch.randn(batch, seq, generator=gen)
    # each row counts the same number of positions, at random places
    order = torch.argsort(torch.rand(batch, seq, generator=gen), dim=-1)
    mask = order < min(counted, seq)
    token, sequence = masked_average(per_token, mask, "token"), masked_average(per_token, mask, "sequence")
    torch.testing.assert_close(sequence, token, rtol=1e-6, atol=1e-6)


def test_sequences_without_counted_tokens_do_not_count_and_units_add_up() -> None:
    per_token = torch.tensor([[1.0, 2.0, 3.0], [9.0, 9.0, 9.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    assert masked_average(per_token, mask, "sequence").item() == pytest.approx((2.0 + 4.0) / 2)
    assert masked_average(per_token, mask, "token").item() == pytest.approx(10.0 / 4)
    assert int(averaging_units(mask, "token")) == 4 and int(averaging_units(mask, "sequence")) == 2
    # sums over parts, divided once by the total units, give the average of the whole
    parts = [masked_sum(per_token[i : i + 1], mask[i : i + 1], "sequence") for i in range(3)]
    total = sum(s for s, _ in parts) / sum(u for _, u in parts)
    torch.testing.assert_close(total, masked_average(per_token, mask, "sequence"))
    with pytest.raises(ValueError, match=r"unknown averaging 'sample'; valid: token, sequence"):
        masked_average(per_token, mask, "sample")  # type: ignore[arg-type]
