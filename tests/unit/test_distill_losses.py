"""Distillation losses: masking, student == teacher, sharded == unsharded (golden properties, STYLE.md)."""

from __future__ import annotations

import pytest
import torch

from specray.distill.data import TrainRow, collate, rank_slice
from specray.distill.loop import train_draft
from specray.distill.losses import IGNORE_INDEX, distillation_divergence, response_cross_entropy
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


def test_sharded_loss_and_gradient_equal_the_unsharded_ones(micro_zoo) -> None:
    """What the loop does per rank (token sum × world / global tokens; DDP then averages gradients)
    gives the full batch's token-mean loss and gradient, although the ranks hold different token counts."""
    model = load_model(str(micro_zoo.draft), "float32")
    rows = [TrainRow((1, 5 + i, 6), tuple(range(7, 9 + i)) + (2,), 1.0) for i in range(5)]

    def loss_and_grads(batch_rows, scale):
        model.zero_grad()
        batch = collate(batch_rows, 0)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        loss_sum = response_cross_entropy(logits, batch.labels) * batch.loss_tokens
        (loss_sum * scale).backward()
        return float(loss_sum.detach()), [p.grad.clone() for p in model.parameters()]

    total = sum(len(r.response_ids) for r in rows)
    full_sum, full_grads = loss_and_grads(rows, 1.0 / total)
    world = 2
    shards = [loss_and_grads([rows[i] for i in rank_slice(5, rank, world)], world / total) for rank in (0, 1)]
    assert sum(s for s, _ in shards) / total == pytest.approx(full_sum / total, rel=1e-6)
    for i, full in enumerate(full_grads):
        averaged = (shards[0][1][i] + shards[1][1][i]) / world  # DDP's all-reduce mean
        torch.testing.assert_close(averaged, full, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("divergence", ["fkl", "rkl", "jsd", "tvd"])
def test_online_kd_with_student_equal_teacher_has_zero_loss(micro_zoo, divergence, tmp_path) -> None:
    """The real loop, draft := target: on-policy and shard rows alike, the loss is 0 within 1e-6."""
    spec = micro_spec(
        micro_zoo,
        f"models.draft={{name_or_path: {micro_zoo.target}}}",
        f"distill.divergence={divergence}",
        "distill.steps=2",
        "distill.report_every=1",
        "distill.onpolicy_fraction=0.5",
        "eval.temperatures=[1.0]",
    )
    make_shards(spec)
    result = train_draft(spec, "online", {0.0: 1.0, 1.0: 1.0}, tmp_path / "draft")
    assert losses(result.curves) == pytest.approx([0.0, 0.0], abs=1e-6)
