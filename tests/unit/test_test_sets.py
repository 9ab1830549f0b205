"""Named test sets (`data.test_sets`), the spec_bench source kind, `data.template: chat`, per-category
figures of a cell, and a workload's weighted speedup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from specray.config import SweepSpec, load_spec
from specray.data.dataset import build_splits, held_out_split
from specray.data.templates import encode_prompts, format_prompt
from specray.keys import cell_key_inputs, digest, spec_key
from specray.metrics import BY_CATEGORY
from specray.report import categories as report_categories
from specray.report.paired import prompt_cells
from specray.specdec.categories import category_figures, with_categories
from specray.specdec.records import CellRecord
from specray.tracking.names import cell_metrics
from tests.conftest import REPO
from tests.plans import encode_test_prompts, evaluated_examples, prompt_categories, prompts_fingerprints

SMOKE = load_spec(REPO / "sweeps" / "smoke.yaml")
QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
    {"question_id": 82, "category": "writing", "turns": ["Write a letter."]},
    {"question_id": 111, "category": "math", "turns": ["What is 2+2?"], "reference": ["4"]},
    {"question_id": 112, "category": "math", "turns": ["What is 3+3?"], "reference": ["6"]},
    {"question_id": 113, "category": "math", "turns": ["What is 4+4?"], "reference": ["8"]},
    {"question_id": 201, "category": "qa", "turns": "Who wrote Hamlet?"},
]


def questions(tmp_path: Path) -> Path:
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def with_data(spec: SweepSpec, **data: Any) -> SweepSpec:
    raw = spec.model_dump(mode="json")
    raw["data"] |= data
    return SweepSpec.model_validate(raw)


def with_bench(tmp_path: Path, categories: list[str] | None = None, **eval_: Any) -> SweepSpec:
    source = {"kind": "spec_bench", "path": str(questions(tmp_path))}
    source |= {"categories": categories} if categories else {}
    raw = SMOKE.model_dump(mode="json")
    raw["data"]["test_sets"] = {"bench": {"source": source}}
    raw["eval"] |= {"test_sets": ["in_domain", "bench"], **eval_}
    return SweepSpec.model_validate(raw)


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
    before, after = prompts_fingerprints(SMOKE), prompts_fingerprints(spec)
    assert after["in_domain"] == before["in_domain"]  # the built-in sets keep their prompts' keys
    assert set(after) == {"in_domain", "bench"}

    def cell(s: SweepSpec, test_set: str, fingerprint: str) -> str:
        return digest(cell_key_inputs(s, "DRAFT", fingerprint, test_set, 1.0, "analytic", 3, 0.1))

    assert cell(spec, "in_domain", after["in_domain"]) == cell(SMOKE, "in_domain", before["in_domain"])
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
    raw = SMOKE.model_dump(mode="json")
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
    spec = with_data(SMOKE, template="chat")
    example = build_splits(spec.data)["in_domain_test"][0]
    [chat] = encode_prompts([example], zoo_tokenizer, spec.data)
    [alpaca] = encode_prompts([example], zoo_tokenizer, SMOKE.data)
    # the tiny template's one-turn chat is the Alpaca prompt (no input) after one BOS
    text = format_prompt(example.instruction + (f"\n\n{example.input}" if example.input.strip() else ""))
    assert chat == zoo_tokenizer("<s>" + text, add_special_tokens=False)["input_ids"][-len(chat) :]
    assert chat.count(zoo_tokenizer.bos_token_id) == 1
    if not example.input.strip():
        assert chat == alpaca


# ---------------------------------------------------------------- per-category figures

LABELS = ["a", "a", "b", "b", "b"]
TERMS = {"target_step": 1.0, "per_drafted_token": 0.1}


def analytic_metrics(tokens: list[int], calls: list[float], beta: list[float]) -> dict[str, Any]:
    return {
        "per_prompt_tokens": tokens,
        "per_prompt_target_calls": calls,
        "per_prompt_beta_sum": beta,
        "per_prompt_drafted": [3.0 * c for c in calls],
        "cost_terms": TERMS,
        "speedup_model": 1.0,
    }


def test_category_figures_are_the_cell_figures_over_its_prompts() -> None:
    metrics = analytic_metrics([10, 10, 8, 8, 8], [5, 5, 2, 2, 2], [6, 4, 7, 7, 7])
    figures = category_figures(metrics, LABELS)
    assert figures["a"] == pytest.approx(
        {"acceptance_rate": 0.5, "block_efficiency": 2.0, "speedup_model": 10 / (5 + 0.1 * 15), "prompts": 2}
    )
    assert figures["b"]["acceptance_rate"] == pytest.approx(21 / 24)
    assert figures["b"]["block_efficiency"] == pytest.approx(4.0)
    assert figures["b"]["speedup_model"] == pytest.approx(8 / (2 + 0.1 * 6))  # CostTerms of the means
    assert category_figures(metrics, LABELS[:4]) == {}  # prompts that do not match the cell's
    # the server metrics, from the expected accepted tokens (vLLM's definitions over the category)
    served = category_figures(metrics | {"per_prompt_accepted": [4, 4, 5, 5, 5]}, LABELS)
    assert served["a"]["mean_acceptance_length"] == pytest.approx(1 + 8 / 10)
    assert served["b"]["draft_acceptance"] == pytest.approx(15 / 18)


def empirical_metrics() -> dict[str, Any]:
    """Three decoded prompts (of a five-prompt test set): counts and seconds summed over repeats."""
    return {
        "per_prompt_tokens": [12, 8, 10],
        "per_prompt_target_calls": [4, 4, 5],
        "per_prompt_accepted": [8, 4, 5],
        "per_prompt_tested": [10, 8, 9],
        "per_prompt_drafted": [12, 12, 15],
        "per_prompt_seconds": [1.0, 1.0, 2.0],
        "per_prompt_target_only_seconds": [3.0, 1.0, 2.0],
        "per_prompt_quality": [1.0, float("nan"), 0.0],
        "speedup": 1.5,
    }


def test_an_empirical_cell_keeps_its_measured_figures_per_category() -> None:
    figures = category_figures(empirical_metrics(), LABELS, "empirical")
    assert set(figures) == {"a", "b"} and figures["b"]["prompts"] == 1  # the cell decoded 3 prompts
    assert figures["a"] == pytest.approx(
        {
            "block_efficiency": 20 / 8,
            "mean_acceptance_length": 1 + 12 / 8,
            "draft_acceptance": 12 / 24,
            "acceptance_rate": 12 / 18,
            "speedup": 4.0 / 2.0,
            "quality": 1.0,  # the prompt without a one-answer metric left out
            "prompts": 2,
        }
    )
    assert figures["b"]["speedup"] == pytest.approx(1.0) and figures["b"]["quality"] == 0.0
    # batched cells time whole batches: no per-category speedup
    batched = empirical_metrics() | {"per_prompt_seconds": [], "per_prompt_target_only_seconds": []}
    assert "speedup" not in category_figures(batched, LABELS, "empirical")["a"]
    assert category_figures(empirical_metrics(), LABELS[:2], "empirical") == {}  # more prompts than labels'
    kept = with_categories(record("bench", "empirical", empirical_metrics()), {"bench": LABELS})
    assert kept.metrics["prompt_categories"] == LABELS[:3]
    points = cell_metrics(kept)
    assert points["speedup/bench/tau_dec_1/category_a"] == pytest.approx(2.0)
    assert points["quality/bench/tau_dec_1/category_b"] == 0.0
    assert points["empirical_acceptance_rate/bench/tau_dec_1/category_a"] == pytest.approx(12 / 18)


def record(test_set: str, estimator: str, metrics: dict, draft: str = "d", tau: float = 1.0) -> CellRecord:
    return CellRecord(draft, "k", test_set, tau, estimator, 3, f"{draft}{tau}{test_set}", 0.1, 0.0, metrics)


def test_per_category_figures_reach_the_record_and_mlflow() -> None:
    metrics = analytic_metrics([10, 10, 8, 8, 8], [5, 5, 2, 2, 2], [6, 4, 7, 7, 7])
    kept = with_categories(record("bench", "analytic", metrics), {"bench": LABELS})
    assert set(kept.metrics[BY_CATEGORY]) == {"a", "b"} and kept.metrics["prompt_categories"] == LABELS
    points = cell_metrics(kept)
    assert points["acceptance_rate/bench/tau_dec_1/category_a"] == pytest.approx(0.5)
    assert points["speedup_model/bench/tau_dec_1/category_b"] == pytest.approx(8 / 2.6)
    untouched = record("in_domain", "analytic", metrics)
    assert with_categories(untouched, {"bench": LABELS}) is untouched  # a set without categories
    totals = record("bench", "empirical", {"speedup": 1.2})
    assert with_categories(totals, {"bench": LABELS}) is totals  # a record of older code: totals only


def cells_frame(rows: list[CellRecord]) -> pd.DataFrame:
    frame = pd.DataFrame([r.flat() for r in rows])
    return frame.assign(paradigm="offline", tau_kd=None, recipe=frame.draft, replicate=0)


def test_workload_speedup_weighs_each_category_at_its_temperature() -> None:
    labels = ["a", "a", "b", "b"]
    fast = analytic_metrics([10, 10, 10, 10], [2, 2, 2, 2], [8, 8, 8, 8])  # E = 5 tokens per call
    slow = analytic_metrics([10, 10, 10, 10], [10, 10, 10, 10], [1, 1, 1, 1])  # E = 1
    rows = [
        with_categories(record("bench", "analytic", fast, tau=0.0), {"bench": labels}),
        with_categories(record("bench", "analytic", slow, tau=0.7), {"bench": labels}),
    ]
    table = prompt_cells(cells_frame(rows))["bench"]
    speed_fast, speed_slow = 10 / (2 + 0.6), 10 / (10 + 3.0)
    mix = report_categories.workload_of("bench", {"a": 0.0, "b": 0.7}, "share", labels)
    result = report_categories.workload_table(table, labels, mix)
    assert result.workload_speedup[0] == pytest.approx(0.5 * speed_fast + 0.5 * speed_slow, abs=1e-4)
    given = report_categories.workload_of("bench", {"a": 0.7, "b": 0.0}, {"a": 3.0, "b": 1.0}, labels)
    result = report_categories.workload_table(table, labels, given)
    assert result.workload_speedup[0] == pytest.approx(0.75 * speed_slow + 0.25 * speed_fast, abs=1e-4)
    # identical prompts within each category: no spread, so the interval is the point
    assert result.ci95[0] == f"[{result.workload_speedup[0]:.3f}, {result.workload_speedup[0]:.3f}]"


def test_the_workload_interval_draws_a_conversations_turns_together() -> None:
    # 12 two-turn conversations in one category, each conversation's turns alike (the second turn's prompt
    # holds the first's answer): resampled as 24 independent prompts the interval would be ~1/sqrt(2) wide
    rng = np.random.default_rng(1)
    per_conversation = rng.integers(5, 30, size=12)
    tokens = np.repeat(per_conversation, 2).tolist()
    calls = [10.0] * 24
    labels = ["a"] * 24
    conversations = [str(i // 2) for i in range(24)]
    metrics = analytic_metrics(tokens, calls, [t * 0.5 for t in tokens])
    row = with_categories(record("bench", "analytic", metrics), {"bench": labels}, {"bench": conversations})
    assert row.metrics["prompt_conversations"] == conversations
    table = prompt_cells(cells_frame([row]))["bench"]
    mix = report_categories.workload_of("bench", {"a": 1.0}, "share", labels)

    def width(owners: list[str] | None) -> float:
        low, high = map(
            float, report_categories.workload_table(table, labels, mix, owners).ci95[0][1:-1].split(",")
        )
        return high - low

    together, apart = width(conversations), width(None)
    assert together / apart == pytest.approx(np.sqrt(2), rel=0.15)
    assert report_categories.clusters(labels, conversations)["a"].shape == (12, 2)
    ragged = ["0", "0", "1"]  # conversations of different lengths: its prompts are drawn one by one
    assert report_categories.clusters(["a"] * 3, ragged)["a"].tolist() == [[0], [1], [2]]


def test_the_report_section_names_every_category_and_the_workload() -> None:
    rng = np.random.default_rng(0)
    labels = ["a"] * 6 + ["b"] * 6
    rows = []
    for tau in (0.0, 1.0):
        tokens = rng.integers(5, 20, size=12).tolist()
        calls = [t / 2.0 for t in tokens]
        beta = [t * 0.6 for t in tokens]
        rows.append(
            with_categories(
                record("bench", "analytic", analytic_metrics(tokens, calls, beta), tau=tau), {"bench": labels}
            )
        )
    workload = {"test_set": "bench", "temperatures": {"a": 0.0, "b": 1.0}, "weights": "share"}
    lines = "\n".join(report_categories.section(cells_frame(rows), workload))
    assert "## Per category: bench" in lines and "### Workload on bench" in lines
    assert "a τ=0 w=0.500, b τ=1 w=0.500" in lines
    assert report_categories.section(cells_frame(rows)[lambda f: f.test_set == "x"]) == []


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
    key = turns.answers_key(examples, "t", 8, "cpu")
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


# ---------------------------------------------------------------- the export's workload block


def plan_cell(draft: str, tau: float, gamma: int, speedups: dict[str, float]) -> CellRecord:
    """An analytic cell whose modelled speedup is the categories' mean, with per-category figures."""
    overall = sum(speedups.values()) / len(speedups)
    metrics = {
        "speedup_model": overall,
        "speedup_model_by_batch": {"1": overall},
        "speedup_model_by_batch_ci95": {"1": 0.01},
        BY_CATEGORY: {
            c: {"speedup_model": s, "prompts": 1.0 if c == "a" else 3.0} for c, s in speedups.items()
        },
    }
    return CellRecord(
        draft, draft, "bench", tau, "analytic", gamma, f"{draft}{tau}{gamma}", 0.1, 0.0, metrics
    )


def test_the_export_weighs_the_plans_route_at_each_categorys_temperature(tmp_path: Path) -> None:
    from specray.serving.plan import plan_batched
    from specray.serving.workload import workload_entry

    cells = [
        plan_cell("d1", 0.0, 3, {"a": 2.0, "b": 1.6}),  # d1 γ=3 wins τ 0
        plan_cell("d1", 0.0, 5, {"a": 1.5, "b": 1.5}),
        plan_cell("d2", 0.0, 3, {"a": 1.2, "b": 1.2}),
        plan_cell("d1", 1.0, 3, {"a": 0.9, "b": 0.7}),  # nothing clears 1 at τ 1: no speculation
        plan_cell("d2", 1.0, 3, {"a": 0.95, "b": 0.8}),
    ]
    spec = with_bench(
        tmp_path,
        ["writing", "math"],
        temperatures=[0.0, 1.0],
        workload={"test_set": "bench", "temperatures": {"writing": 1.0, "math": 0.0}},
    )
    cells = [replace_categories(c, {"a": "writing", "b": "math"}) for c in cells]
    entry = workload_entry(spec, cells, plan_batched(cells, "bench"))
    assert entry is not None
    by_category = {c["category"]: c for c in entry["categories"]}
    assert by_category["math"] | {"weight": 0} == {
        "category": "math",
        "temperature": 0.0,
        "weight": 0,
        "draft_key": "d1",
        "gamma": 3,
        "speedup_model": 1.6,
    }
    assert by_category["writing"]["gamma"] == 0 and by_category["writing"]["speedup_model"] == 1.0
    assert by_category["writing"]["weight"] == pytest.approx(0.25)  # its share of the prompts
    assert entry["plan_speedup"] == pytest.approx(0.25 * 1.0 + 0.75 * 1.6)
    # each draft alone at its best γ per category: d1 = 0.25·0.9 + 0.75·1.6, d2 = 0.25·0.95 + 0.75·1.2
    assert [d["draft"] for d in entry["drafts"]] == ["d1", "d2"]
    assert entry["drafts"][0]["workload_speedup"] == pytest.approx(0.25 * 0.9 + 0.75 * 1.6)
    assert workload_entry(SMOKE, cells, plan_batched(cells, "bench")) is None


def replace_categories(cell: CellRecord, names: dict[str, str]) -> CellRecord:
    from dataclasses import replace

    figures = {names[c]: f for c, f in cell.metrics[BY_CATEGORY].items()}
    return replace(cell, metrics={**cell.metrics, BY_CATEGORY: figures})
