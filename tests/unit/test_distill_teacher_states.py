"""Online KD's teacher states computed once (`teacher_states.py`): the same loss and the same training as a
teacher forward pass every step, up to fp round-off; fewer teacher rows run per step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specray.distill.data import TrainRow, collate
from specray.distill.inputs import prepare_inputs
from specray.distill.loop import train_draft
from specray.distill.loop_setup import setup_run
from specray.distill.losses import ResponseLoss
from specray.distill.session import LocalSession
from specray.distill.teacher_states import (
    PromptStates,
    StaticStates,
    cached_response_states,
    estimated_mb,
    prompt_cache_matches,
    response_states,
)
from specray.draft import one_draft
from specray.models.loading import load_model
from tests.unit.test_distill_loop import losses, make_shards, micro_spec
from tests.unit.test_distill_losses import ROWS

ROWS_4 = [*ROWS, TrainRow((1, 4, 4), (6, 7, 8, 9, 2), 1.0)]
# prompts of 2..5 tokens, responses of 0..5: both paddings of the cached pass, and its edge cases
ROWS_CACHED = [*ROWS_4, TrainRow((1, 4), (3, 3, 3, 2), 0.5), TrainRow((1, 5, 6), (), 1.0)]


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
    inputs = prepare_inputs(one_draft(spec, "online", {1.0: 1.0}, Path("draft")))
    run = setup_run(
        one_draft(spec, "online", {1.0: 1.0}, tmp_path / "draft"), inputs, LocalSession(tmp_path, None)
    )
    rows, prompts = run.data.static_rows()
    assert len(rows) == spec.distill.steps * 2
    assert run.states is not None and set(run.states.states) == set(rows)
    every_row = [run.data.micro_batch(step, 0) for step in range(1, spec.distill.steps + 1)]
    assert prompts == {row.prompt_ids for batch in every_row for row in batch}
    assert run.states.prompts is not None and set(run.states.prompts.kv) == prompts


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
            one_draft(
                micro_spec(micro_zoo, *common, *overrides), "online", {0.0: 1.0, 1.0: 1.0}, tmp_path / name
            )
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


def test_the_cached_pass_gives_each_rows_own_full_pass_states(micro_zoo) -> None:
    """The responses run after the kept prompt caches (left-padded to the longest prompt): every row's
    states equal its own unpadded full forward's, whatever the other rows' prompt and response lengths."""
    _, teacher = _models(micro_zoo)
    prompts = PromptStates(teacher, [row.prompt_ids for row in ROWS_CACHED], batch_size=2)
    assert len(prompts) == 4  # (1, 4) and (1, 5, 6) twice
    cached = cached_response_states(teacher, prompts, ROWS_CACHED, pad_token_id=0)
    alone = [response_states(teacher, [row], pad_token_id=0)[0] for row in ROWS_CACHED]
    for row, a, b in zip(ROWS_CACHED, cached, alone, strict=True):
        assert a.shape == (len(row.response_ids), teacher.config.hidden_size)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert prompt_cache_matches(teacher, prompts, ROWS_CACHED, pad_token_id=0)
    sizes = {len(p) for p in prompts.kv}
    assert PromptStates.estimated_mb(teacher, prompts.kv) == pytest.approx(prompts.megabytes())
    assert sizes == {2, 3, 5}


@pytest.mark.parametrize("precision", ["bf16 weights", "bf16 autocast"])
def test_a_bf16_teacher_keeps_its_prompt_caches(micro_zoo, monkeypatch, precision: str) -> None:
    """bf16's round-off between the cached and the full pass is not a wrong cache: the check judges it at
    bf16's tolerance. It used to upcast first and then always apply fp32's, so SmolLM2 in bf16 (30 layers of
    round-off, about 1% of the states' scale apart) never kept its caches; here that gap is planted."""
    import specray.distill.teacher_states as states

    _, teacher = _models(micro_zoo)
    if precision == "bf16 weights":
        teacher = teacher.to(torch.bfloat16)
    real = states.cached_response_states

    def one_percent_off(*args, **kwargs):
        return [t + 0.01 * t.abs().amax().clamp(min=1.0) if t.numel() else t for t in real(*args, **kwargs)]

    monkeypatch.setattr(states, "cached_response_states", one_percent_off)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16 autocast"):
        prompts = PromptStates(teacher, [row.prompt_ids for row in ROWS_CACHED], batch_size=2)
        assert prompt_cache_matches(teacher, prompts, ROWS_CACHED, pad_token_id=0)
    with torch.autocast("cpu", enabled=False):  # in fp32 the same gap is a wrong cache
        fp32 = teacher.float()
        assert not prompt_cache_matches(
            fp32, PromptStates(fp32, [r.prompt_ids for r in ROWS_CACHED], 2), ROWS_CACHED, 0
        )


def test_a_teacher_whose_cached_pass_differs_is_caught(micro_zoo) -> None:
    """A forward that ignores the positions it is given (numbering from the cache's length instead) is
    right for the longest prompt only: the check sees it, and the run would not use the caches."""
    _, teacher = _models(micro_zoo)
    prompts = PromptStates(teacher, [row.prompt_ids for row in ROWS_CACHED], batch_size=2)
    forward = teacher.forward

    def own_positions(*args, **kwargs):
        kwargs.pop("position_ids", None)
        return forward(*args, **kwargs)

    teacher.forward = own_positions
    assert not prompt_cache_matches(teacher, prompts, ROWS_CACHED, pad_token_id=0)
    teacher.forward = forward
    assert prompt_cache_matches(teacher, prompts, ROWS_CACHED, pad_token_id=0)


def test_kept_states_and_prompt_caches_share_the_budget(micro_zoo, tmp_path, caplog) -> None:
    """States first, prompt caches with what is left: a budget that holds the states only keeps no
    prompt cache (and says so); every fresh row then runs in full."""
    spec = micro_spec(micro_zoo, "distill.onpolicy_fraction=0.5")
    make_shards(spec)
    inputs = prepare_inputs(one_draft(spec, "online", {1.0: 1.0}, Path("draft")))
    run = setup_run(
        one_draft(spec, "online", {1.0: 1.0}, tmp_path / "draft"), inputs, LocalSession(tmp_path / "a", None)
    )
    assert run.states is not None and run.states.prompts is not None
    rows, _ = run.data.static_rows()
    states_mb = estimated_mb(rows, run.teacher.config.hidden_size)
    tight = micro_spec(
        micro_zoo, "distill.onpolicy_fraction=0.5", f"distill.teacher_cache_mb={states_mb * 1.01}"
    )
    with caplog.at_level("INFO", logger="specray.distill"):
        run = setup_run(
            one_draft(tight, "online", {1.0: 1.0}, tmp_path / "draft"),
            inputs,
            LocalSession(tmp_path / "b", None),
        )
    assert run.states is not None and run.states.prompts is None
    assert "prompt caches need" in caplog.text
