"""Distillation losses: masking, student == teacher, sharded == unsharded, chunked == plain (golden
properties, STYLE.md), and the loss averaging through the real loop."""

from __future__ import annotations

import pytest
import torch

from specray.distill.data import TrainRow, collate, rank_slice
from specray.distill.loop import train_draft
from specray.distill.losses import (
    IGNORE_INDEX,
    ResponseLoss,
    check_chunkable,
    distillation_divergence,
    response_cross_entropy,
)
from specray.draft import one_draft
from specray.models.loading import load_model
from tests.unit.test_distill_loop import losses, make_shards, micro_spec

VOCAB = 11
ROWS = [
    TrainRow((1, 5, 6), (7, 8, 2), 1.0),  # 2 = EOS, emitted by the teacher: it must be learnt too
    TrainRow((1, 4), (9, 2), 1.0),
    TrainRow((1, 3, 3, 3, 4), (5,), 1.0),  # stopped by length: no EOS
]


def test_collate_labels_only_response_tokens_including_eos() -> None:
    batch = collate(ROWS, pad_token_id=0)
    assert batch.input_ids.tolist()[0] == [1, 5, 6, 7, 8, 2]
    assert batch.attention_mask.tolist()[1] == [1, 1, 1, 1, 0, 0]
    ignore = IGNORE_INDEX
    # labels[t] is the token logits[t] predicts: the last prompt position predicts the first response token
    assert batch.labels.tolist() == [
        [ignore, ignore, 7, 8, 2, ignore],
        [ignore, 9, 2, ignore, ignore, ignore],
        [ignore, ignore, ignore, ignore, 5, ignore],
    ]
    assert batch.loss_tokens == 6 and batch.tokens == 6 + 4 + 6


def test_offline_loss_ignores_prompt_and_padding_positions() -> None:
    batch = collate(ROWS, pad_token_id=0)
    logits = torch.randn(3, 6, VOCAB, generator=torch.Generator().manual_seed(0))
    loss = response_cross_entropy(logits, batch.labels)
    counted = batch.labels != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(logits[counted], batch.labels[counted])
    assert loss == pytest.approx(float(expected), rel=1e-6)
    changed = torch.where(counted[..., None], logits, torch.randn_like(logits) * 50)
    changed[~counted] = changed[~counted].nan_to_num()  # any finite value at prompt/padding positions
    assert float(response_cross_entropy(changed, batch.labels)) == float(loss)


@pytest.mark.parametrize("divergence", ["fkl", "rkl", "jsd", "tvd"])
def test_divergence_is_zero_for_student_equal_teacher_and_ignores_the_prompt(divergence) -> None:
    batch = collate(ROWS, pad_token_id=0)
    logits = torch.randn(3, 6, VOCAB, generator=torch.Generator().manual_seed(1))
    assert float(distillation_divergence(logits, logits.clone(), batch.labels, divergence)) == pytest.approx(
        0.0, abs=1e-6
    )
    counted = (batch.labels != IGNORE_INDEX)[..., None]
    teacher = torch.where(counted, logits, torch.randn_like(logits))  # differs on prompt positions only
    assert float(distillation_divergence(logits, teacher, batch.labels, divergence, 2.0)) == pytest.approx(
        0.0, abs=1e-6
    )
    assert float(distillation_divergence(logits, torch.randn_like(logits), batch.labels, divergence)) > 1e-3


@pytest.mark.parametrize("divergence", [None, "fkl", "jsd"])
@pytest.mark.parametrize("averaging", ["token", "sequence"])
def test_the_loss_module_is_the_tested_loss_functions(micro_zoo, divergence, averaging) -> None:
    """The loop's plain path is `response_cross_entropy` (offline) or `distillation_divergence` (online),
    to the bit: the properties above hold for what the loop trains on."""
    student = load_model(str(micro_zoo.draft), "float32")
    teacher = load_model(str(micro_zoo.target), "float32")
    batch = collate(ROWS, pad_token_id=0)
    loss = ResponseLoss(divergence, temperature=0.8, jsd_beta=0.3, averaging=averaging)
    with torch.no_grad():
        total = loss(student, teacher, batch.input_ids, batch.attention_mask, batch.labels)
        logits = student(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        if divergence is None:
            expected = response_cross_entropy(logits, batch.labels, averaging)
        else:
            teacher_logits = teacher(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            options = (divergence, 0.8, 0.3, averaging)
            expected = distillation_divergence(logits, teacher_logits, batch.labels, *options)
    assert float(total / loss.units(batch.labels)) == float(expected)


@pytest.mark.parametrize("averaging", ["token", "sequence"])
def test_sharded_loss_and_gradient_equal_the_unsharded_ones(micro_zoo, averaging) -> None:
    """What the loop does per rank (sum × world / global units; DDP then averages gradients) gives the
    full batch's mean loss and gradient, although the ranks hold different token and response counts."""
    model = load_model(str(micro_zoo.draft), "float32")
    rows = [TrainRow((1, 5 + i, 6), tuple(range(7, 9 + i)) + (2,), 1.0) for i in range(5)]
    loss = ResponseLoss(averaging=averaging)

    def loss_and_grads(batch_rows, world, units):
        model.zero_grad()
        batch = collate(batch_rows, 0)
        loss_sum = loss(model, None, batch.input_ids, batch.attention_mask, batch.labels)
        (loss_sum * world / units).backward()
        return float(loss_sum.detach()), [p.grad.clone() for p in model.parameters()]

    total = loss.units(collate(rows, 0).labels)
    assert total == (sum(len(r.response_ids) for r in rows) if averaging == "token" else len(rows))
    full_sum, full_grads = loss_and_grads(rows, 1, total)
    world = 2
    shards = [loss_and_grads([rows[i] for i in rank_slice(5, rank, world)], world, total) for rank in (0, 1)]
    assert sum(s for s, _ in shards) / total == pytest.approx(full_sum / total, rel=1e-6)
    for i, full in enumerate(full_grads):
        averaged = (shards[0][1][i] + shards[1][1][i]) / world  # DDP's all-reduce mean
        torch.testing.assert_close(averaged, full, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- chunked LM heads == plain logits


def _loss_and_grads(loss: ResponseLoss, student, teacher, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    student.zero_grad()
    value = loss(student, teacher, batch.input_ids, batch.attention_mask, batch.labels)
    value.backward()
    return value.detach(), [p.grad.clone() for p in student.parameters()]


@pytest.mark.parametrize("divergence", [None, "fkl", "rkl", "jsd", "tvd"])
@pytest.mark.parametrize("averaging", ["token", "sequence"])
def test_chunked_loss_equals_the_plain_one_with_gradients(micro_zoo, divergence, averaging) -> None:
    """On the tiny zoo (fp32), the loss module with chunk_size 3 (several chunks of the 14 response
    positions, the last one short) gives the plain path's loss and gradient of every student parameter
    to 1e-6, for cross-entropy (offline) and every divergence."""
    student = load_model(str(micro_zoo.draft), "float32")
    teacher = load_model(str(micro_zoo.target), "float32").requires_grad_(False)
    rows = [*ROWS, TrainRow((1, 4, 4), (6, 7, 8, 9, 2), 1.0)]
    batch = collate(rows, pad_token_id=0)
    assert batch.loss_tokens == 11
    options = {"divergence": divergence, "temperature": 0.8, "jsd_beta": 0.3, "averaging": averaging}
    plain = _loss_and_grads(ResponseLoss(**options, chunk_size=0), student, teacher, batch)
    chunked = _loss_and_grads(ResponseLoss(**options, chunk_size=3), student, teacher, batch)
    torch.testing.assert_close(chunked[0], plain[0], rtol=1e-6, atol=1e-6)
    for expected, actual in zip(plain[1], chunked[1], strict=True):
        # 5e-6: fp32 sums in another order; one element of the micro draft's gradients differs by 1.8e-6
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=5e-6)
    assert any(float(g.abs().sum()) > 0 for g in chunked[1])  # the gradient is not trivially zero


@pytest.mark.parametrize("divergence", [None, "fkl"])
def test_chunked_loss_keeps_no_vocabulary_sized_activation_for_backward(micro_zoo, divergence) -> None:
    """What autograd keeps for the backward pass: the plain path keeps [.., vocab] logits (and fp32 copies);
    the chunked path keeps hidden states only and recomputes each chunk's logits in the backward pass."""
    student = load_model(str(micro_zoo.draft), "float32")
    teacher = load_model(str(micro_zoo.target), "float32").requires_grad_(False)
    batch = collate(ROWS, pad_token_id=0)
    parameters = {p.untyped_storage().data_ptr() for m in (student, teacher) for p in m.parameters()}
    vocab = student.config.vocab_size

    def vocabulary_sized(chunk_size: int) -> int:
        saved: list[torch.Tensor] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            ResponseLoss(divergence, chunk_size=chunk_size)(
                student, teacher, batch.input_ids, batch.attention_mask, batch.labels
            )
        activations = [t for t in saved if t.untyped_storage().data_ptr() not in parameters]
        return sum(1 for t in activations if t.dim() and t.shape[-1] == vocab)

    assert vocabulary_sized(0) > 0
    assert vocabulary_sized(2) == 0


def test_a_model_whose_head_is_not_the_whole_story_cannot_be_chunked(micro_zoo) -> None:
    model = load_model(str(micro_zoo.draft), "float32")
    check_chunkable(model)  # a Llama: logits = lm_head(final normed hidden state)
    model.config.tie_last_hidden_states = False  # the last hidden state is now the one before the norm
    with pytest.raises(ValueError, match="set distill.loss_chunk_size=0"):
        check_chunkable(model)


def test_the_loop_with_chunked_heads_trains_like_the_plain_loop(micro_zoo, tmp_path) -> None:
    """Online KD through the real loop: chunking 4 response tokens at a time changes nothing beyond
    fp round-off; sequence averaging really reaches the loop (other losses than token averaging)."""
    make_shards(micro_spec(micro_zoo))
    common = ("distill.steps=3", "distill.report_every=1", "eval.temperatures=[1.0]")
    mixture = {0.0: 1.0, 1.0: 1.0}

    def run(name: str, *overrides: str):
        spec = micro_spec(micro_zoo, *common, *overrides)
        return train_draft(one_draft(spec, "online", mixture, tmp_path / name))

    plain = run("plain", "distill.loss_chunk_size=0", "distill.loss_averaging=sequence")
    chunked = run("chunked", "distill.loss_chunk_size=4", "distill.loss_averaging=sequence")
    assert losses(chunked.curves) == pytest.approx(losses(plain.curves), rel=1e-5)
    for p, q in zip(
        load_model(str(plain.output_dir)).parameters(),
        load_model(str(chunked.output_dir)).parameters(),
        strict=True,
    ):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    token = run("token", "distill.loss_chunk_size=4", "distill.loss_averaging=token")
    assert losses(token.curves)[0] != pytest.approx(losses(plain.curves)[0], rel=1e-3)


@pytest.mark.parametrize("divergence", ["fkl", "rkl", "jsd", "tvd"])
def test_online_kd_with_student_equal_teacher_has_zero_loss(micro_zoo, divergence, tmp_path) -> None:
    """The real loop, draft := target: on-policy and shard rows alike, the loss is 0 within 1e-6.

    TVD's gradient at P = Q is sign(0) = 0 only while the teacher's logits are bit-identical to the
    student's; kept teacher states (`teacher_states.py`, computed in another batch) differ by round-off,
    which |p − q|'s kink turns into a full step away from the teacher: TVD runs the teacher every step."""
    cache = "distill.teacher_cache_mb=0" if divergence == "tvd" else "distill.teacher_cache_mb=1024"
    spec = micro_spec(
        micro_zoo,
        f"models.draft={{name_or_path: {micro_zoo.target}}}",
        f"distill.divergence={divergence}",
        "distill.steps=2",
        "distill.report_every=1",
        "distill.onpolicy_fraction=0.5",
        "eval.temperatures=[1.0]",
        cache,
    )
    make_shards(spec)
    result = train_draft(one_draft(spec, "online", {0.0: 1.0, 1.0: 1.0}, tmp_path / "draft"))
    assert losses(result.curves) == pytest.approx([0.0, 0.0], abs=1e-6)
