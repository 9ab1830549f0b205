"""Spec-Bench question files, chat-template prompts and `specray bench`'s answer files and figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from specray.config.vocabulary import MT_BENCH_CATEGORIES, WORKLOADS, resolve_categories
from specray.data.chat import encode_chat, render_chat, require_chat_template
from specray.data.examples import Example
from specray.data.spec_bench import Question, load_questions, workload_temperatures
from specray.data.templates import format_prompt
from specray.errors import DataError, ModelError
from specray.serving.bench import (
    BenchSettings,
    Choice,
    identical_at_zero,
    run_bench,
    speed_report,
)
from specray.specdec.decoder import autoregressive_decode, speculative_decode


def write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


ROWS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
    {"question_id": 101, "category": "math", "turns": ["What is 2+2?", "And 3+3?"], "reference": ["4", "6"]},
    {"question_id": 201, "category": "qa", "turns": "Who wrote Hamlet?"},
    {"question_id": 481, "category": "rag", "turns": ["Name two."], "reference": [["a", "b"]]},
]


def test_both_forms_of_turns_and_references_load(tmp_path: Path) -> None:
    questions = load_questions(write_lines(tmp_path / "q.jsonl", ROWS))
    assert [q.question_id for q in questions] == [81, 101, 201, 481]
    assert questions[0].turns == ("Write a poem.", "Shorter.") and questions[0].reference is None
    assert questions[1].reference == (("4",), ("6",))
    assert questions[2].turns == ("Who wrote Hamlet?",)  # one string: a single-turn question
    assert questions[3].reference == (("a", "b"),)  # several acceptable answers for one turn


def test_category_filters_and_groups(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "q.jsonl", ROWS)
    assert [q.category for q in load_questions(path, ["mt_bench"])] == ["writing", "math"]
    assert [q.category for q in load_questions(path, ["qa", "rag"])] == ["qa", "rag"]
    assert resolve_categories(["mt_bench"]) == MT_BENCH_CATEGORIES
    with pytest.raises(DataError, match=r"unknown category 'poetry'; allowed: mt_bench, spec_bench, writing"):
        load_questions(path, ["poetry"])
    with pytest.raises(DataError, match="no questions in categories coding"):
        load_questions(path, ["coding"])


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", r"q.jsonl:2: not valid JSON"),
        ('["a list"]', r"q.jsonl:2: a question is a JSON object, got list"),
        (
            {"question_id": "x", "category": "qa", "turns": ["t"]},
            r"q.jsonl:2: 'question_id' must be an integer",
        ),
        ({"question_id": 9, "category": "", "turns": ["t"]}, r"q.jsonl:2: 'category' must be a non-empty"),
        ({"question_id": 9, "category": "qa"}, r"q.jsonl:2: missing 'turns'"),
        ({"question_id": 9, "category": "qa", "turns": [1]}, r"q.jsonl:2: 'turns' must be a string or"),
        (
            {"question_id": 9, "category": "qa", "turns": ["t", " "]},
            r"q.jsonl:2: 'turns' holds an empty turn",
        ),
        ({"question_id": 9, "category": "qa", "turns": ["t"], "reference": [3]}, r"q.jsonl:2: 'reference'"),
        ({"question_id": 81, "category": "qa", "turns": ["t"]}, r"q.jsonl:2: question_id 81 appears twice"),
    ],
)
def test_bad_rows_are_refused_naming_file_line_and_field(tmp_path: Path, row, message: str) -> None:
    path = write_lines(tmp_path / "q.jsonl", [ROWS[0], row])
    with pytest.raises(DataError, match=message):
        load_questions(path)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.jsonl: file not found"):
        load_questions(tmp_path / "nope.jsonl")


def test_the_mt_bench_workload_is_fastchats_table() -> None:
    assert workload_temperatures("mt_bench", ["writing", "math", "stem"]) == {
        "writing": 0.7,
        "math": 0.0,
        "stem": 0.1,
    }
    assert set(WORKLOADS["mt_bench"]) == set(MT_BENCH_CATEGORIES)
    with pytest.raises(DataError, match="no temperature for categories qa"):
        workload_temperatures("mt_bench", ["writing", "qa"])
    with pytest.raises(DataError, match="unknown workload 'chat'; presets: mt_bench"):
        workload_temperatures("chat", ["writing"])


def test_the_real_question_file_loads(shared_data: Path) -> None:
    questions = load_questions(shared_data / "spec_bench" / "question.jsonl")
    assert len(questions) == 480
    mt = [q for q in questions if q.category in MT_BENCH_CATEGORIES]
    assert len(mt) == 80 and all(len(q.turns) == 2 for q in mt)


# ---------------------------------------------------------------- chat templates


@pytest.fixture(scope="module")
def zoo_tokenizer(micro_zoo):
    return AutoTokenizer.from_pretrained(micro_zoo.target)


def test_a_single_turn_chat_is_the_alpaca_prompt_the_zoo_knows(zoo_tokenizer) -> None:
    assert render_chat(zoo_tokenizer, ["Add 2 and 3."]) == "<s>" + format_prompt("Add 2 and 3.")


def test_a_later_turn_carries_the_conversation_so_far(zoo_tokenizer) -> None:
    golden = (
        "<s>Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\nAdd 2 and 3.\n\n### Response:\n5</s>\n\n"
        "### Instruction:\nNow double it.\n\n### Response:\n"
    )
    assert render_chat(zoo_tokenizer, ["Add 2 and 3.", "Now double it."], ["5"]) == golden
    ids = encode_chat(zoo_tokenizer, ["Add 2 and 3.", "Now double it."], ["5"])
    assert ids[0] == zoo_tokenizer.bos_token_id and ids.count(zoo_tokenizer.bos_token_id) == 1
    assert zoo_tokenizer.decode(ids) == golden
    with pytest.raises(ValueError, match="2 turns need 1 earlier answers, got 0"):
        render_chat(zoo_tokenizer, ["a", "b"])


def test_a_whole_conversation_as_training_data_is_prompted_with_its_first_turn(zoo_tokenizer) -> None:
    from specray.data.spec_bench import expand_turns
    from specray.data.templates import prompt_text

    whole = Example("81", "Add 2 and 3.", "", "5", "math", ("Add 2 and 3.", "Now double it."), ("5", "10"))
    # the teacher's request and the training probe's prompt (no earlier answers): the first turn
    assert prompt_text(whole, "chat", zoo_tokenizer) == render_chat(zoo_tokenizer, ["Add 2 and 3."])
    assert prompt_text(whole, "alpaca") == format_prompt("Add 2 and 3.")
    # a test set's later turn is never prompted without the answers before it
    later = expand_turns([whole])[1]
    with pytest.raises(ValueError, match="2 turns need 1 earlier answers, got 0"):
        prompt_text(later, "chat", zoo_tokenizer)
    assert prompt_text(later, "chat", zoo_tokenizer, ["5"]).endswith("Now double it.\n\n### Response:\n")


def test_a_tokenizer_without_a_chat_template_is_refused_naming_the_model(zoo_tokenizer) -> None:
    require_chat_template(zoo_tokenizer, "zoo/target")
    bare = zoo_tokenizer.__class__.from_pretrained(zoo_tokenizer.name_or_path)
    bare.chat_template = None
    with pytest.raises(ModelError, match="my/model: its tokenizer has no chat template"):
        require_chat_template(bare, "my/model")


# ---------------------------------------------------------------- decoding and the answer files


@pytest.fixture(scope="module")
def models(micro_zoo):
    target = LlamaForCausalLM.from_pretrained(micro_zoo.target).eval()
    draft = LlamaForCausalLM.from_pretrained(micro_zoo.draft).eval()
    return target, draft


def test_step_tokens_add_up_to_the_output(models, zoo_tokenizer) -> None:
    target, draft = models
    prompt = encode_chat(zoo_tokenizer, ["Add 2 and 3."])
    for tau in (0.0, 1.0):
        generator = torch.Generator().manual_seed(3)
        out = speculative_decode(target, draft, prompt, tau, 4, 20, zoo_tokenizer.eos_token_id, generator)
        assert sum(out.step_tokens) == len(out.tokens) and len(out.step_tokens) == out.stats.target_calls
        assert all(1 <= n <= 5 for n in out.step_tokens)
    alone = autoregressive_decode(target, prompt, 1.0, 20, zoo_tokenizer.eos_token_id, torch.Generator())
    assert alone.step_tokens == [1] * len(alone.tokens)


def bench_settings(micro_zoo, draft: str | None, gamma: int | None = 3) -> BenchSettings:
    temperatures = {"writing": 0.7, "math": 0.0, "qa": 1.0, "rag": 0.0}
    choice = Choice(draft, gamma if draft else None)
    return BenchSettings(str(micro_zoo.target), temperatures, dict.fromkeys(temperatures, choice), 12, 0)


def test_bench_writes_spec_bench_answer_files(tmp_path: Path, micro_zoo, models, zoo_tokenizer) -> None:
    questions = load_questions(write_lines(tmp_path / "q.jsonl", ROWS))
    settings = bench_settings(micro_zoo, str(micro_zoo.draft))
    target, draft = models
    files = run_bench(questions, zoo_tokenizer, target, lambda path: draft, settings, tmp_path / "out")
    spec = [json.loads(line) for line in files.speculative.read_text().splitlines()]
    base = [json.loads(line) for line in files.baseline.read_text().splitlines()]
    assert [r["question_id"] for r in spec] == [81, 101, 201, 481] == [r["question_id"] for r in base]
    for row in spec:
        assert set(row) >= {"question_id", "category", "answer_id", "model_id", "tstamp", "choices"}
        (choice,) = row["choices"]
        assert set(choice) == {
            "index",
            "turns",
            "decoding_steps",
            "new_tokens",
            "wall_time",
            "accept_lengths",
        }
        turns = len(next(q for q in questions if q.question_id == row["question_id"]).turns)
        assert len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"]) == turns
        assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
        assert len(choice["accept_lengths"]) == sum(choice["decoding_steps"])
    assert spec[0]["model_id"].endswith("-specray-sd") and base[0]["model_id"].endswith("-vanilla")
    # greedy: the speculative answers are the baseline's, turn for turn
    assert identical_at_zero(files.speculative, files.baseline) == (2, 2)
    rows = {r.group: r for r in speed_report(files.speculative, files.baseline, zoo_tokenizer)}
    assert set(rows) == {"writing", "math", "qa", "rag", "mt_bench", "overall"}
    assert rows["overall"].questions == 4 and rows["mt_bench"].questions == 2
    assert not list((tmp_path / "out").glob("*.partial"))


def test_speed_report_computes_spec_benchs_figures(tmp_path: Path, zoo_tokenizer) -> None:
    """Hand-made answer files: per-question speeds averaged, the baseline counted by re-tokenising."""

    def line(qid: int, category: str, turns: list[str], new: list[int], wall: list[float], accepts) -> dict:
        choice = dict(index=0, turns=turns, decoding_steps=[1], new_tokens=new, wall_time=wall)
        choice["accept_lengths"] = accepts
        return dict(question_id=qid, category=category, choices=[choice], temperature=0.0)

    spec = write_lines(
        tmp_path / "sd.jsonl",
        [line(1, "math", ["x"], [10], [1.0], [3, 3, 4]), line(2, "qa", ["y"], [6, 6], [1.0, 2.0], [2, 2])],
    )
    text = "Add 2 and 3."
    n = len(zoo_tokenizer(text).input_ids) - 1  # Spec-Bench's count: the text's tokens less one for BOS
    base = write_lines(
        tmp_path / "base.jsonl",
        [line(1, "math", [text], [99], [2.0], [1]), line(2, "qa", [text, text], [99], [1.0, 1.0], [1])],
    )
    rows = {r.group: r for r in speed_report(spec, base, zoo_tokenizer)}
    assert rows["math"].tokens_per_s == pytest.approx(10.0)
    assert rows["math"].baseline_tokens_per_s == pytest.approx(n / 2.0)
    assert rows["math"].mean_accepted_tokens == pytest.approx(10 / 3)
    assert rows["overall"].tokens_per_s == pytest.approx((10.0 + 12 / 3.0) / 2)
    assert rows["overall"].baseline_tokens_per_s == pytest.approx((n / 2.0 + 2 * n / 2.0) / 2)
    assert rows["overall"].speedup == pytest.approx(7.0 / (0.75 * n))
    assert rows["overall"].mean_accepted_tokens == pytest.approx(14 / 5)
    assert rows["overall"].decoder_speedup == pytest.approx(7.0 / ((99 / 2.0 + 99 / 2.0) / 2))


def test_a_rerun_keeps_finished_questions_and_refuses_other_settings(
    tmp_path: Path, micro_zoo, models, zoo_tokenizer
) -> None:
    questions = load_questions(write_lines(tmp_path / "q.jsonl", ROWS))
    target, _ = models
    out = tmp_path / "out"
    settings = bench_settings(micro_zoo, None)
    calls: list[int] = []

    def crash_after_two(n: int) -> None:
        calls.append(n)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_bench(questions, zoo_tokenizer, target, lambda p: target, settings, out, crash_after_two)
    partial = out / f"{Path(str(micro_zoo.target)).name}-specray-sd.jsonl.partial"
    kept = [json.loads(line)["answer_id"] for line in partial.read_text().splitlines()]
    assert len(kept) == 2 and not list(out.glob("*-vanilla.jsonl"))
    files = run_bench(questions, zoo_tokenizer, target, lambda p: target, settings, out)
    answers = [json.loads(line)["answer_id"] for line in files.speculative.read_text().splitlines()]
    assert answers[:2] == kept and len(answers) == 4  # the first two were not answered again
    other = BenchSettings(**{**settings.__dict__, "max_new_tokens": 5})
    with pytest.raises(DataError, match="answers already exist"):
        run_bench(questions, zoo_tokenizer, target, lambda p: target, settings, out)
    (files.speculative).unlink()
    (files.baseline).unlink()
    with pytest.raises(DataError, match=r"other settings \(max_new_tokens differ\)"):
        run_bench(questions, zoo_tokenizer, target, lambda p: target, other, out)


def test_questions_are_frozen_records() -> None:
    question = Question(1, "qa", ("t",))
    with pytest.raises(AttributeError):
        question.category = "math"  # type: ignore[misc]
