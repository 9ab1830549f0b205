"""Training-data sources (DistillSpec Table 1, Algorithm A.2): presets and their validation, the exact
row fractions of every micro-batch, ground-truth responses, and every preset through the real loop."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import get_args

import pyarrow as pa
import pytest
import torch
import yaml

from specray.config import SweepSpec, dump_spec
from specray.config.presets import DATA_PRESETS, DataPresetName
from specray.distill.checkpoints import is_finished
from specray.distill.data import TrainRow, generator, onpolicy_indices, row_sources, with_ground_truth
from specray.distill.inputs import ground_truth_responses, prepare_inputs
from specray.distill.loop import _local_rows, train_draft
from specray.distill.loop_setup import setup_run
from specray.distill.session import LocalSession
from specray.draft import one_draft
from specray.errors import DataError, SpecError
from specray.models.loading import load_tokenizer
from tests.unit.test_distill_loop import losses, make_shards, micro_spec

FRACTIONS = (0.0, 0.1, 0.25, 1 / 3, 0.5, 0.7, 1.0)


@pytest.fixture(scope="module")
def spec(micro_zoo) -> SweepSpec:
    spec = micro_spec(micro_zoo)
    make_shards(spec)
    return spec


# ---------------------------------------------------------------- the spec


def test_preset_names_are_the_spec_type() -> None:
    assert get_args(DataPresetName) == tuple(DATA_PRESETS)


@pytest.mark.parametrize(
    ("value", "fixed", "student"),
    [
        ("seqkd", 0.0, 0.0),
        ("supervised_kd", 1.0, 0.0),
        ("imitkd", 0.5, 0.5),
        ("f_distill", 0.0, 0.5),
        ("gkd", 0.0, 1.0),
        ("tempspec", 0.75, 0.25),  # λ = onpolicy_fraction = 0.25 on-policy, the rest ground truth
        ("tempspec_teacher", 0.0, 0.25),  # λ on-policy, the rest from the teacher shards
        ("{fixed: 0.2, student: 0.3}", 0.2, 0.3),
        ("{student: 1.0}", 0.0, 1.0),
    ],
)
def test_data_sources_resolve_to_fractions(micro_zoo, value: str, fixed: float, student: float) -> None:
    spec = micro_spec(micro_zoo, f"distill.data_sources={value}", "distill.onpolicy_fraction=0.25")
    sources = spec.distill.sources
    assert (sources.fixed, sources.student) == pytest.approx((fixed, student))
    assert sources.teacher == pytest.approx(1.0 - fixed - student)
    assert spec.distill.reads_onpolicy_fraction == (value in ("tempspec", "tempspec_teacher"))
    assert SweepSpec.model_validate(yaml.safe_load(dump_spec(spec))) == spec  # the dump round-trips


def test_the_default_is_the_original_online_recipe(micro_zoo) -> None:
    spec = micro_spec(micro_zoo, "distill.onpolicy_fraction=0.4")
    assert spec.distill.data_sources == "tempspec_teacher"
    assert (spec.distill.sources.fixed, spec.distill.sources.student) == (0.0, 0.4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["distill.data_sources=distillspec"], "distill.data_sources.preset: Input should be 'seqkd'"),
        (
            ["distill.data_sources={fixed: 0.7, student: 0.6}"],
            "distill.data_sources.fractions: fixed (0.7) + student (0.6) must be <= 1",
        ),
        (
            ["distill.data_sources={fixed: -0.1}"],
            "distill.data_sources.fractions.fixed: Input should be greater",
        ),
        (["distill.data_sources={teacher: 0.5}"], "fractions.teacher: unknown key (allowed: fixed, student)"),
        (
            ["distill.data_sources=gkd", "tune.onpolicy_fractions=[0.25,0.5]"],
            "tune.onpolicy_fractions searches λ, but distill.data_sources gkd does not read it",
        ),
    ],
)
def test_bad_data_sources_name_the_field(micro_zoo, overrides: list[str], message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        micro_spec(micro_zoo, *overrides)


# ---------------------------------------------------------------- which rows


def test_row_sources_take_exact_counts_per_micro_batch() -> None:
    for batch_size in range(1, 18):
        for fixed in FRACTIONS:
            for student in (s for s in FRACTIONS if fixed + s <= 1.0 + 1e-9):
                sources = row_sources(batch_size, fixed, student, seed=0, step=3, micro=1)
                students = round(student * batch_size)
                assert len(sources.student) == students
                assert len(sources.fixed) == round((fixed + student) * batch_size) - students
                assert not sources.fixed & sources.student
                assert sources.fixed | sources.student <= set(range(batch_size))
                # the student rows are the ones the online paradigm always chose (its formula before
                # data sources, written out): drafts of the default recipe keep their rows
                order = torch.randperm(batch_size, generator=generator(0, "onpolicy", 3, 1))
                assert set(sources.student) == set(order[:students].tolist())
                assert set(sources.student) == onpolicy_indices(batch_size, student, 0, 3, 1)


def test_row_sources_are_a_pure_function_of_seed_step_and_micro() -> None:
    chosen = row_sources(16, 0.25, 0.5, seed=7, step=2, micro=0)
    assert chosen == row_sources(16, 0.25, 0.5, seed=7, step=2, micro=0)
    others = [
        row_sources(16, 0.25, 0.5, 7, 3, 0),
        row_sources(16, 0.25, 0.5, 7, 2, 1),
        row_sources(16, 0.25, 0.5, 8, 2, 0),
    ]
    assert all(other != chosen for other in others)
    # over many micro-batches every row position gets every source (no position is stuck with one)
    seen = [set() for _ in range(16)]
    for step in range(1, 60):
        s = row_sources(16, 0.25, 0.5, 7, step, 0)
        for i in range(16):
            seen[i].add("fixed" if i in s.fixed else "student" if i in s.student else "teacher")
    assert all(kinds == {"fixed", "student", "teacher"} for kinds in seen)


def test_with_ground_truth_replaces_only_the_chosen_rows() -> None:
    rows = [TrainRow((1, 2), (3,), 0.5, (4, 5)), TrainRow((6,), (7,), 0.5, (8,)), TrainRow((9,), (10,), 0.5)]
    replaced = with_ground_truth(rows, {1})
    assert [r.response_ids for r in replaced] == [(3,), (8,), (10,)] and replaced[1].prompt_ids == (6,)
    with pytest.raises(ValueError, match="row 2 has no ground-truth output"):
        with_ground_truth(rows, {2})


# ---------------------------------------------------------------- ground truth and batches in the loop


class MergingTokenizer:
    """Characters as ids, except that "ab" is one token (999): a merge that can cross a boundary."""

    eos_token_id = 0

    def __call__(self, texts, add_special_tokens: bool = True) -> dict:
        encoded = [
            self._encode(text, add_special_tokens) for text in ([texts] if isinstance(texts, str) else texts)
        ]
        return {"input_ids": encoded[0] if isinstance(texts, str) else encoded}

    @staticmethod
    def _encode(text: str, bos: bool) -> list[int]:
        ids, i = [1] if bos else [], 0
        while i < len(text):
            ids.append(999 if text[i : i + 2] == "ab" else ord(text[i]))
            i += 2 if text[i : i + 2] == "ab" else 1
        return ids


def test_ground_truth_follows_the_prompt_tokens_or_falls_back_to_the_output_alone() -> None:
    tokenizer = MergingTokenizer()
    prompts = {"p1": "Q: x\n", "p2": "Q: a", "p3": "Q: y"}  # p2's "a" merges with the output's "b"
    outputs = {"p1": "yes", "p2": "bc", "p3": "abcdefgh"}
    table = pa.table(
        {
            "prompt_id": list(prompts),
            "prompt": list(prompts.values()),
            "prompt_token_ids": [tokenizer(p)["input_ids"] for p in prompts.values()],
        }
    )
    truth = ground_truth_responses(table, outputs, tokenizer, limit=5)
    assert truth["p1"] == (ord("y"), ord("e"), ord("s"), 0)  # what follows the prompt's tokens, then EOS
    assert truth["p2"] == (ord("b"), ord("c"), 0)  # "ab" merged across the boundary: the output alone
    assert truth["p3"] == (999, ord("c"), ord("d"), ord("e"), ord("f"))  # cut at the limit, no EOS
    with pytest.raises(DataError, match="1 shard prompts are not in the train split"):
        ground_truth_responses(table, {"p1": "yes", "p2": "bc"}, tokenizer, limit=5)


def test_ground_truth_is_tokenised_as_a_response_to_the_shard_prompt(spec) -> None:
    fixed = spec.model_copy(
        update={"distill": spec.distill.model_copy(update={"data_sources": "supervised_kd"})}
    )
    inputs = prepare_inputs(one_draft(fixed, "online", {1.0: 1.0}, Path("draft")))
    tokenizer = load_tokenizer(inputs.target_path)
    from specray.data.dataset import build_splits

    outputs = {e.output for e in build_splits(spec.data)["train"]}
    limit = spec.teacher.max_new_tokens
    for row in inputs.rows[1.0]:
        truth = row.ground_truth_ids
        assert 0 < len(truth) <= limit
        text = tokenizer.decode(truth, skip_special_tokens=True)
        if truth[-1] == tokenizer.eos_token_id:  # complete: the whole output, then EOS
            assert text in outputs
        else:  # cut at the teacher's length limit, like a teacher response
            assert len(truth) == limit and any(o.startswith(text) for o in outputs)
    assert (
        prepare_inputs(one_draft(spec, "online", {1.0: 1.0}, Path("draft"))).rows[1.0][0].ground_truth_ids
        == ()
    )  # not needed


def test_a_batch_takes_its_rows_from_the_sources_in_the_stated_fractions(micro_zoo, spec, tmp_path) -> None:
    """B = 8 with λ1 = ¼, λ2 = ½: exactly 2 ground-truth rows, 4 student samples and 2 teacher rows in
    every micro-batch; and two DDP ranks together train on exactly the rows of one."""
    mixed = micro_spec(micro_zoo, "distill.batch_size=8", "distill.data_sources={fixed: 0.25, student: 0.5}")
    inputs = prepare_inputs(one_draft(mixed, "online", {0.0: 1.0, 1.0: 1.0}, Path("draft")))
    run = setup_run(
        one_draft(mixed, "online", {0.0: 1.0, 1.0: 1.0}, tmp_path / "draft"),
        inputs,
        LocalSession(tmp_path, None, "cpu"),
    )
    for step in (1, 2, 3):
        rows = run.data.micro_batch(step, 0)
        sources = row_sources(8, 0.25, 0.5, mixed.distill.seed, step, 0)
        assert (len(sources.fixed), len(sources.student)) == (2, 4)
        responses = [row.response_ids for row in _local_rows(run, step, 0)]
        for i, (row, response) in enumerate(zip(rows, responses, strict=True)):
            if i in sources.fixed:
                assert response == row.ground_truth_ids, (step, i)
            elif i in sources.student:
                assert 0 < len(response) <= mixed.distill.max_new_tokens, (step, i)
            else:
                assert response == row.response_ids, (step, i)
        assert any(responses[i] != rows[i].response_ids for i in sources.student)  # really sampled
        ranks = []
        for rank in (0, 1):
            run.session.rank, run.session.world_size = rank, 2
            ranks.append([row.response_ids for row in _local_rows(run, step, 0)])
        run.session.rank, run.session.world_size = 0, 1
        assert ranks[0] == responses[0::2] and ranks[1] == responses[1::2]


@pytest.mark.parametrize("preset", list(DATA_PRESETS))
def test_every_preset_trains_through_the_real_loop(micro_zoo, spec, preset: str, tmp_path: Path) -> None:
    recipe = micro_spec(micro_zoo, f"distill.data_sources={preset}", "distill.steps=2")
    result = train_draft(one_draft(recipe, "online", {1.0: 1.0}, tmp_path / preset))
    assert is_finished(result.output_dir) and result.steps == 2
    assert losses(result.curves) and all(math.isfinite(x) and x >= 0 for x in losses(result.curves))
