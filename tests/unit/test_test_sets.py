"""Named test sets (`data.test_sets`), the spec_bench source kind, `data.template: chat` and multi-turn
prompts (per-category figures and workloads: test_category_figures.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from specray.config import SweepSpec
from specray.data.dataset import build_splits, held_out_split
from specray.data.templates import encode_prompts, format_prompt
from specray.keys import answers_key, cell_key_inputs, digest, spec_key
from tests.bench_sets import SMOKE_SPEC, questions, with_bench, with_data
from tests.plans import encode_test_prompts, evaluated_examples, prompt_categories, prompts_fingerprints


def test_a_named_test_set_loads_its_questions_with_their_categories(tmp_path: Path) -> None:
    spec = with_bench(tmp_path, ["mt_bench"])
    examples = build_splits(spec.data)[held_out_split("bench")]
    # qa left out; the categories interleaved (each in file order), so the empirical cells' first
    # prompts cover every category
    assert [e.id for e in examples] == ["81", "111", "82", "112", "113"]
    assert [e.family for e in examples] == ["writing", "math", "writing", "math", "math"]
    assert examples[0].turns == ("Write a poem.", "Shorter.") and examples[2].turns == ()
    assert examples[1].output == "4"  # the first turn's reference feeds the quality metrics
    # under the Alpaca template a question is one prompt; under chat one per turn, next to each other
    assert prompt_categories(spec) == {"bench": ["writing", "math", "writing", "math", "math"]}
    chat = with_data(spec, template="chat")
    assert prompt_categories(chat) == {"bench": ["writing", "writing", "math", "writing", "math", "math"]}


def test_a_named_test_set_has_its_own_cells_and_leaves_the_built_in_keys(tmp_path: Path) -> None:
    spec = with_bench(tmp_path)
    before, after = prompts_fingerprints(SMOKE_SPEC), prompts_fingerprints(spec)
    assert after["in_domain"] == before["in_domain"]  # the built-in sets keep their prompts' keys
    assert set(after) == {"in_domain", "bench"}

    def cell(s: SweepSpec, test_set: str, fingerprint: str) -> str:
        return digest(cell_key_inputs(s, "DRAFT", fingerprint, test_set, 1.0, "analytic", 3, 0.1))

    assert cell(spec, "in_domain", after["in_domain"]) == cell(SMOKE_SPEC, "in_domain", before["in_domain"])
    assert cell(spec, "bench", after["bench"]) != cell(spec, "in_domain", after["in_domain"])
    fewer = with_bench(tmp_path, ["math"])
    assert prompts_fingerprints(fewer)["bench"] != after["bench"]  # its categories are in its key


def test_a_sized_named_test_set_is_a_seeded_draw(tmp_path: Path) -> None:
    spec = with_bench(tmp_path)
    raw = spec.model_dump(mode="json")
    raw["data"]["test_sets"]["bench"]["size"] = 3
    drawn = build_splits(SweepSpec.model_validate(raw).data)[held_out_split("bench")]
    assert [e.id for e in drawn] == ["113", "111", "82"]  # golden: the draw of data.seed 0
    raw["data"]["seed"] = 1
    other = build_splits(SweepSpec.model_validate(raw).data)[held_out_split("bench")]
    assert len(other) == 3 and other != drawn


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"eval": {"test_sets": ["gsm"]}}, r"eval.test_sets \['gsm'\] are not test sets; allowed: in_domain"),
        ({"data": {"test_sets": {"in_domain": {}}}}, "'in_domain' is a built-in test set"),
        ({"data": {"test_sets": {"Bench": {}}}}, "test set name 'Bench': use lowercase"),
        ({"data": {"template": "vicuna"}}, "Input should be 'alpaca' or 'chat'"),
        ({"bench": {"categories": ["poetry"]}}, "unknown category 'poetry'; allowed: mt_bench, spec_bench"),
        ({"train": {"categories": ["math"]}}, "'categories' filters a spec_bench source, not a synthetic"),
    ],
)
def test_bad_test_sets_are_one_line_errors(tmp_path: Path, change: dict, message: str) -> None:
    raw = SMOKE_SPEC.model_dump(mode="json")
    bench = {"kind": "spec_bench", "path": str(questions(tmp_path))}
    if "bench" in change:
        raw["data"]["test_sets"] = {"bench": {"source": bench | change["bench"]}}
    elif "train" in change:
        raw["data"]["train"] |= change["train"]
    else:
        for section, values in change.items():
            if section == "data" and "test_sets" in values:
                values = {"test_sets": {k: {"source": bench} for k in values["test_sets"]}}
            raw[section] |= values
    with pytest.raises(ValidationError, match=message):
        SweepSpec.model_validate(raw)


def test_a_workload_is_checked_against_its_test_set_and_the_grid(tmp_path: Path) -> None:
    mt = {"temperatures": "mt_bench", "test_set": "bench"}
    with pytest.raises(ValidationError, match=r"eval.workload.temperatures \[0.1, 0.7\] are not in"):
        with_bench(tmp_path, ["mt_bench"], workload=mt)
    with pytest.raises(ValidationError, match=r"no temperature for categories \['qa'\]"):
        with_bench(tmp_path, ["math", "qa"], workload=mt)
    with pytest.raises(ValidationError, match="unknown workload preset 'vicuna'; presets: mt_bench"):
        with_bench(tmp_path, ["math"], workload=mt | {"temperatures": "vicuna"})
    with pytest.raises(ValidationError, match="'in_domain' has no categories"):
        with_bench(tmp_path, ["math"], workload=mt | {"test_set": "in_domain"})
    with pytest.raises(
        ValidationError, match=r"weights must name exactly the categories \['writing', 'math'\]"
    ):
        with_bench(
            tmp_path,
            ["writing", "math"],
            workload={**mt, "weights": {"math": 1.0}},
            temperatures=[0.0, 0.7, 1.0],
        )
    spec = with_bench(tmp_path, ["writing", "math"], workload=mt, temperatures=[0.0, 0.7, 1.0])
    assert spec.eval.workload is not None and spec.eval.workload.table["writing"] == 0.7
    assert spec_key(spec) != spec_key(with_bench(tmp_path, ["writing", "math"], temperatures=[0.0, 0.7, 1.0]))


@pytest.fixture(scope="module")
def zoo_tokenizer(micro_zoo: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(micro_zoo.target)


def test_chat_prompts_render_through_the_template_without_a_second_bos(zoo_tokenizer: Any) -> None:
    spec = with_data(SMOKE_SPEC, template="chat")
    example = build_splits(spec.data)["in_domain_test"][0]
    [chat] = encode_prompts([example], zoo_tokenizer, spec.data)
    [alpaca] = encode_prompts([example], zoo_tokenizer, SMOKE_SPEC.data)
    # the tiny template's one-turn chat is the Alpaca prompt (no input) after one BOS
    text = format_prompt(example.instruction + (f"\n\n{example.input}" if example.input.strip() else ""))
    assert chat == zoo_tokenizer("<s>" + text, add_special_tokens=False)["input_ids"][-len(chat) :]
    assert chat.count(zoo_tokenizer.bos_token_id) == 1
    if not example.input.strip():
        assert chat == alpaca


# ---------------------------------------------------------------- multi-turn prompts


def test_a_conversation_is_one_prompt_per_turn_under_the_chat_template(tmp_path: Path) -> None:
    alpaca = with_bench(tmp_path, ["writing"])
    chat = with_data(alpaca, template="chat")
    assert [e.id for e in evaluated_examples(alpaca)["bench"]] == [
        "81",
        "82",
    ]  # a conversation: its first turn
    expanded = evaluated_examples(chat)["bench"]
    assert [e.id for e in expanded] == ["81", "81/turn_2", "82"]
    assert expanded[1].turns == ("Write a poem.", "Shorter.") and expanded[1].instruction == "Shorter."
    assert prompt_categories(chat) == {"bench": ["writing", "writing", "writing"]}
    math = evaluated_examples(with_data(with_bench(tmp_path, ["math"]), template="chat"))["bench"]
    assert [e.output for e in math] == ["4", "6", "8"]  # each turn's reference


def test_a_later_turn_is_prompted_with_the_targets_own_earlier_answer(tmp_path: Path, micro_zoo: Any) -> None:
    from transformers import AutoTokenizer

    from specray.data.chat import encode_chat, render_chat
    from specray.models.loading import decode_text, load_model
    from specray.specdec import turns
    from specray.specdec.decoder import autoregressive_decode

    target = str(micro_zoo.target)
    spec = with_data(with_bench(tmp_path, ["writing"]), template="chat")
    examples = evaluated_examples(spec)["bench"]
    key = answers_key(turns.later_turns(examples), "t", 8, "cpu")
    answers = turns.conversation_answers(examples, target, key, 8)
    assert list(answers) == ["81/turn_2"] and len(answers["81/turn_2"]) == 1
    # the answer is the target's greedy continuation of turn 1's chat prompt, as the decoder's own
    # one-row loop (not the batched sampler the answers come from) decodes it
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = load_model(target)
    alone = autoregressive_decode(
        model, encode_chat(tokenizer, ["Write a poem."]), 0.0, 8, tokenizer.eos_token_id
    )
    assert answers["81/turn_2"][0] == decode_text(tokenizer, alone.tokens).strip()
    prompts = encode_test_prompts(spec, tokenizer, target)["bench"]
    golden = render_chat(tokenizer, ["Write a poem.", "Shorter."], answers["81/turn_2"])
    assert (
        prompts[1] == tokenizer(golden, add_special_tokens=False)["input_ids"][-spec.data.max_prompt_tokens :]
    )
    # cached: a second call reads the answers back, and they are in the test set's prompts key
    assert turns.conversation_answers(examples, "/nonexistent", key, 8) == answers
    assert (
        prompts_fingerprints(spec)["bench"]
        != prompts_fingerprints(with_data(spec, template="alpaca"))["bench"]
    )
    longer = SweepSpec.model_validate(
        spec.model_dump(mode="json") | {"eval": spec.eval.model_dump(mode="json") | {"max_new_tokens": 9}}
    )
    assert prompts_fingerprints(longer)["bench"] != prompts_fingerprints(spec)["bench"]
