"""Online KD's teacher states computed once (`teacher_states.py`): the same loss and the same training as a
teacher forward pass every step, up to fp round-off; fewer teacher rows run per step."""

from __future__ import annotations

import pytest
import torch

from specray.distill.data import TrainRow, collate
from specray.distill.inputs import prepare_inputs
from specray.distill.loop import _setup, _static_rows, train_draft
from specray.distill.losses import ResponseLoss
from specray.distill.session import LocalSession
from specray.distill.teacher_states import StaticStates, estimated_mb, response_states
from specray.models.loading import load_model
from tests.unit.test_distill_loop import losses, make_shards, micro_spec
from tests.unit.test_distill_losses import ROWS

ROWS_4 = [*ROWS, TrainRow((1, 4, 4), (6, 7, 8, 9, 2), 1.0)]


def _models(micro_zoo):
    student = load_model(str(micro_zoo.draft), "float32")
    teacher = load_model(str(micro_zoo.target), "float32").requires_grad_(False)
    return student, teacher


def test_response_states_are_each_rows_own_response_positions(micro_zoo) -> None:
    _, teacher = _models(micro_zoo)
    together = response_states(teacher, ROWS_4, pad_token_id=0)
    assert [s.shape for s in together] == [(len(r.response_ids), teacher.config.hidden_size) for r in ROWS_4]
    alone = [response_states(teacher, [row], pad_token_id=0)[0] for row in ROWS_4]  # no padding at all
    for a, b in zip(together, alone, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert estimated_mb(ROWS_4 + ROWS_4, 8) == sum(len(r.response_ids) for r in ROWS_4) * 8 * 4 / 2**20


@pytest.mark.parametrize("chunk_size", [0, 3])
@pytest.mark.parametrize("divergence", ["fkl", "tvd"])
def test_kept_states_give_the_loss_and_gradient_of_a_teacher_forward(
    micro_zoo, chunk_size, divergence
) -> None:
    """Half the rows kept (computed in another batch), half fresh (a student sample's row): the loss and
    every gradient equal the plain path's, which runs the teacher on the whole batch."""
    student, teacher = _models(micro_zoo)
    kept = StaticStates(teacher, ROWS_4[::2], pad_token_id=0, batch_size=1)
    assert len(kept) == 2
    batch = collate(ROWS_4, pad_token_id=0)
    loss = ResponseLoss(divergence, temperature=0.8, chunk_size=chunk_size)
    results = []
    for states in (None, kept.for_batch(teacher, ROWS_4, pad_token_id=0)):
        student.zero_grad()
        value = loss(student, teacher, batch.input_ids, batch.attention_mask, batch.labels, states)
        value.backward()
        results.append((value.detach(), [p.grad.clone() for p in student.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    for expected, actual in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def test_static_rows_are_exactly_the_non_student_rows(micro_zoo, tmp_path) -> None:
    """λ = 0.5 on batch 4: two rows per step are static, so 4 steps hold 8 (with repeats)."""
    spec = micro_spec(micro_zoo, "distill.onpolicy_fraction=0.5")
    make_shards(spec)
    inputs = prepare_inputs(spec, "online", {1.0: 1.0})
    run = _setup(spec, "online", {1.0: 1.0}, inputs, LocalSession(tmp_path, None))
    rows = list(_static_rows(run))
    assert len(rows) == spec.distill.steps * 2
    assert run.states is not None and set(run.states.states) == set(rows)


def test_the_loop_with_kept_states_trains_like_the_loop_without(micro_zoo, tmp_path) -> None:
    make_shards(micro_spec(micro_zoo))
    common = (
        "distill.steps=3",
        "distill.report_every=1",
        "eval.temperatures=[1.0]",
        "distill.loss_chunk_size=4",
    )

    def run(name: str, *overrides: str):
        return train_draft(
            micro_spec(micro_zoo, *common, *overrides), "online", {0.0: 1.0, 1.0: 1.0}, tmp_path / name
        )

    every_step = run("every_step", "distill.teacher_cache_mb=0")
    kept = run("kept")
    assert losses(kept.curves) == pytest.approx(losses(every_step.curves), rel=1e-5)
    for p, q in zip(
        load_model(str(every_step.output_dir)).parameters(),
        load_model(str(kept.output_dir)).parameters(),
        strict=True,
    ):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
