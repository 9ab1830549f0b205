"""Data loaders and splits: small files in tmp_path, plus the real files in ../shared/data when present."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specray.data.examples import Example
from specray.data.loaders import (
    DataError,
    load_alpaca,
    load_examples,
    load_gsm8k,
    load_parquet,
    load_self_instruct,
)
from specray.data.splits import fingerprint, split_examples
from specray.data.templates import format_prompt

ALPACA_ROWS = [
    {"instruction": "Name a color.", "input": "", "output": "Blue."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Say hi.", "output": "Hi."},  # no input at all
    {"instruction": "Echo it.", "input": None, "output": "it"},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def make_examples(n: int) -> list[Example]:
    return [Example(f"ex:{i}", f"instruction {i}", "", f"output {i}") for i in range(n)]


# --- Alpaca JSON / JSON Lines ---------------------------------------------------------------------


def test_alpaca_json_list(tmp_path):
    path = tmp_path / "tiny_alpaca.json"
    path.write_text(json.dumps(ALPACA_ROWS), encoding="utf-8")
    examples = load_alpaca(str(path))
    assert [e.id for e in examples] == ["tiny_alpaca:0", "tiny_alpaca:1", "tiny_alpaca:2", "tiny_alpaca:3"]
    assert examples[1] == Example("tiny_alpaca:1", "Add the numbers.", "2 and 3", "5")
    assert examples[2].input == "" and examples[3].input == ""


def test_alpaca_jsonl_matches_json_list(tmp_path):
    json_path = tmp_path / "data.json"
    json_path.write_text(json.dumps(ALPACA_ROWS), encoding="utf-8")
    jsonl_path = write_jsonl(tmp_path / "data.jsonl", ALPACA_ROWS)
    assert load_alpaca(str(jsonl_path)) == load_alpaca(str(json_path))
    assert load_examples("jsonl", str(jsonl_path)) == load_alpaca(str(jsonl_path))


def test_alpaca_id_column_is_used(tmp_path):
    path = write_jsonl(
        tmp_path / "ids.jsonl", [{"id": "a1", "instruction": "x", "output": "y"}, {"id": 7, **ALPACA_ROWS[0]}]
    )
    assert [e.id for e in load_alpaca(str(path))] == ["a1", "7"]


def test_bad_rows_are_skipped_counted_and_logged_once(tmp_path, caplog):
    rows = [
        *ALPACA_ROWS,
        {"instruction": "No output here."},
        {"instruction": "   ", "output": "empty instruction"},
        {"instruction": 3, "output": "non-string instruction"},
    ]
    path = write_jsonl(tmp_path / "dirty.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="specray.data.loaders"):
        examples = load_alpaca(str(path))
    assert len(examples) == len(ALPACA_ROWS)
    warnings = [r for r in caplog.records if r.name == "specray.data.loaders"]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert str(path) in message and "skipped 3 of 7 rows" in message and "dirty:4" in message


def test_all_invalid_file_names_the_file(tmp_path):
    path = write_jsonl(tmp_path / "useless.jsonl", [{"instruction": "", "output": "x"}, {"instruction": "y"}])
    with pytest.raises(DataError, match=r"useless\.jsonl: no usable rows \(2 rows read"):
        load_alpaca(str(path))


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.jsonl"
    for load in (lambda: load_alpaca(str(missing)), lambda: load_gsm8k(str(missing))):
        with pytest.raises(DataError, match=r"nope\.jsonl: file not found"):
            load()


def test_mistyped_path_is_not_sent_to_the_hub(monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", pytest.fail)  # any hub call fails the test
    with pytest.raises(DataError, match="file not found"):
        load_alpaca("data/alpaca_typo.json")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match=r"empty\.jsonl: the file is empty"):
        load_alpaca(str(path))


def test_non_utf8_file(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'\xff\xfe{"instruction": "caf\xe9", "output": "x"}\n')
    with pytest.raises(DataError, match=r"latin\.jsonl: not valid UTF-8") as info:
        load_alpaca(str(path))
    assert "\n" not in str(info.value) and info.value.__cause__ is not None


def test_a_lone_latin1_byte_inside_a_string_is_an_encoding_error(tmp_path):
    """pyarrow reads this file and fails only when the row is used; the loader checks the encoding first."""
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"instruction": "caf\xe9", "output": "x"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl: not valid UTF-8 text \(byte 0xe9 at offset 20\)"):
        load_alpaca(str(path))


def test_invalid_json(tmp_path):
    for name, text in [("broken.jsonl", '{"instruction": "a", "output": \n'), ("broken.json", '[{"a": 1},')]:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        with pytest.raises(DataError, match=rf"{name}: not valid JSON") as info:
            load_alpaca(str(path))
        assert "\n" not in str(info.value)


def test_hub_name_goes_to_datasets_and_failures_become_data_errors(monkeypatch):
    calls = []

    def fake_load_dataset(name, split, **kwargs):
        calls.append((name, split))
        return datasets.Dataset.from_list([{"instruction": "i", "input": "", "output": "o"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_alpaca("tatsu-lab/alpaca", split="train[:1]") == [Example("alpaca:0", "i", "", "o")]
    assert calls == [("tatsu-lab/alpaca", "train[:1]")]

    def offline(*args, **kwargs):
        raise ConnectionError("no network\nsecond line")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"^tatsu-lab/alpaca: .*hub failed \(ConnectionError: no network\)$"):
        load_alpaca("tatsu-lab/alpaca")


def test_loading_restores_datasets_settings(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", ALPACA_ROWS)
    verbosity = datasets.utils.logging.get_verbosity()
    bars = datasets.is_progress_bar_enabled()
    load_alpaca(str(path))
    assert datasets.utils.logging.get_verbosity() == verbosity
    assert datasets.is_progress_bar_enabled() == bars


# --- GSM8K and self-instruct ----------------------------------------------------------------------


def test_gsm8k(tmp_path):
    rows = [{"question": "What is 1+1?", "answer": "1+1=2\n#### 2"}, {"question": "Q2", "answer": ""}]
    path = write_jsonl(tmp_path / "test.jsonl", rows)
    examples = load_gsm8k(str(path))
    assert examples == [Example("gsm8k/test:0", "What is 1+1?", "", "1+1=2\n#### 2", "gsm8k")]
    assert load_examples("gsm8k", str(path)) == examples


def test_gsm8k_wrong_columns_lists_them(tmp_path):
    path = write_jsonl(tmp_path / "alpaca.jsonl", ALPACA_ROWS)
    with pytest.raises(
        DataError, match=r"alpaca\.jsonl: missing column\(s\) question, answer; .*instruction"
    ):
        load_gsm8k(str(path))


def test_self_instruct_one_example_per_instance(tmp_path):
    task = {
        "id": "seed_task_9",
        "name": "antonyms",
        "instruction": "Give the antonym.",
        "instances": [{"input": "hot", "output": "cold"}, {"input": "up", "output": "down"}],
        "is_classification": False,
    }
    empty_task = {**task, "id": "seed_task_10", "instances": []}
    path = write_jsonl(tmp_path / "seed_tasks.jsonl", [task, empty_task])
    examples = load_self_instruct(str(path))
    assert examples == [
        Example("seed_task_9:0", "Give the antonym.", "hot", "cold", "self_instruct"),
        Example("seed_task_9:1", "Give the antonym.", "up", "down", "self_instruct"),
    ]
    assert load_examples("self_instruct", str(path)) == examples


# --- Parquet --------------------------------------------------------------------------------------


def test_parquet_with_alpaca_columns(tmp_path):
    path = tmp_path / "shard.parquet"
    pq.write_table(pa.Table.from_pylist(ALPACA_ROWS[:2]), path)
    assert load_parquet(str(path)) == [
        Example("shard:0", "Name a color.", "", "Blue."),
        Example("shard:1", "Add the numbers.", "2 and 3", "5"),
    ]


def test_parquet_with_column_mapping(tmp_path):
    path = tmp_path / "renamed.parquet"
    pq.write_table(pa.table({"prompt": ["p0", "p1"], "response": ["r0", "r1"], "uid": ["u0", "u1"]}), path)
    columns = {"instruction": "prompt", "output": "response", "id": "uid"}
    examples = load_examples("parquet", str(path), columns=columns)
    assert examples == [Example("u0", "p0", "", "r0"), Example("u1", "p1", "", "r1")]


def test_parquet_wrong_schema_lists_missing_and_present_columns(tmp_path):
    path = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"prompt": ["p"], "answer": ["a"]}), path)
    with pytest.raises(DataError) as info:
        load_parquet(str(path))
    message = str(info.value)
    assert "wrong.parquet" in message and "missing column(s) instruction, output" in message
    assert "prompt, answer" in message


def test_parquet_mapping_to_absent_column_and_unknown_field(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(ALPACA_ROWS[:1]), path)
    with pytest.raises(DataError, match="missing column.*context"):
        load_parquet(str(path), {"input": "context"})
    with pytest.raises(DataError, match="unknown field.*prompt.*valid fields"):
        load_parquet(str(path), {"prompt": "instruction"})


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(b"this is not parquet")
    with pytest.raises(DataError, match=r"corrupt\.parquet: not a readable Parquet file"):
        load_parquet(str(path))


def test_unknown_kind_lists_valid_kinds(tmp_path):
    with pytest.raises(
        DataError, match="unknown data kind 'csv'.*alpaca, gsm8k, self_instruct, parquet, jsonl"
    ):
        load_examples("csv", str(tmp_path / "x.csv"))


def test_column_mapping_rejected_for_fixed_formats(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(DataError, match="column mapping"):
        load_examples("gsm8k", str(path), columns={"instruction": "question"})


# --- splits and fingerprint -----------------------------------------------------------------------

SIZES = {"validation": 10, "in_domain_test": 20, "train": 50}


def test_split_is_deterministic_and_sized():
    examples = make_examples(100)
    first = split_examples(examples, SIZES, seed=0)
    assert first == split_examples(examples, SIZES, seed=0)
    assert list(first) == list(SIZES)
    assert {name: len(part) for name, part in first.items()} == SIZES
    ids = [e.id for part in first.values() for e in part]
    assert len(set(ids)) == 80  # disjoint
    assert first != split_examples(examples, SIZES, seed=1)


def test_split_remainder():
    examples = make_examples(100)
    parts = split_examples(examples, {"validation": 10, "train": -1, "in_domain_test": 20}, seed=3)
    assert [len(parts[name]) for name in ("validation", "train", "in_domain_test")] == [10, 70, 20]
    assert sorted(e.id for part in parts.values() for e in part) == sorted(e.id for e in examples)


def test_split_too_large_and_bad_sizes():
    with pytest.raises(DataError, match="ask for 80 examples, but only 50 exist"):
        split_examples(make_examples(50), SIZES, seed=0)
    with pytest.raises(ValueError, match="at most one"):
        split_examples(make_examples(50), {"a": -1, "b": -1}, seed=0)
    with pytest.raises(ValueError, match="integer >= 0"):
        split_examples(make_examples(50), {"a": -2}, seed=0)


def test_split_ignores_global_rng_and_hash_seed():
    """Same split in fresh interpreters with different PYTHONHASHSEED and a disturbed global RNG."""
    code = (
        "import random; random.seed(12345); random.random()\n"
        "from specray.data.examples import Example\n"
        "from specray.data.splits import split_examples\n"
        "xs = [Example(f'ex:{i}', f'i{i}', '', f'o{i}') for i in range(30)]\n"
        "print([e.id for e in split_examples(xs, {'a': 5, 'b': -1}, seed=7)['a']])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for hash_seed in ("1", "2")
    }
    expected = [e.id for e in split_examples(make_examples(30), {"a": 5, "b": -1}, seed=7)["a"]]
    assert outputs == {f"{expected}\n"}


def test_fingerprint_is_stable_and_sensitive():
    examples = make_examples(5)
    value = fingerprint(examples)
    assert len(value) == 16 and int(value, 16) >= 0
    assert fingerprint(list(examples)) == value
    changed = [*examples[:4], Example("ex:4", "instruction 4", "", "output 4", family="other")]
    assert fingerprint(changed) != value
    assert fingerprint(examples[::-1]) != value
    assert fingerprint(examples[:4]) != value


def test_fingerprint_golden_value():
    # Pinned: the fingerprint keys cached teacher shards, so changing the hashing scheme must be deliberate.
    assert fingerprint([Example("a:0", "Say hi.", "", "Hi.", "")]) == "5bcd7265ea18ecc8"


# --- the real files in ../shared/data -------------------------------------------------------------


def shared_data_dir() -> Path:
    root = Path(
        os.environ.get("SPECRAY_SHARED_DATA")
        or Path(__file__).resolve().parents[2].parent / "shared" / "data"
    )
    if not root.is_dir():
        pytest.skip(f"shared data folder not found at {root}: these tests need ../shared/data")
    return root


def shared_file(*candidates: str) -> Path:
    root = shared_data_dir()
    for candidate in candidates:
        if (root / candidate).is_file():
            return root / candidate
    pytest.skip(f"none of {', '.join(candidates)} found under {root}")


def test_real_gsm8k_test_set():
    examples = load_gsm8k(str(shared_file("gsm8k/test.jsonl")))
    assert len(examples) == 1319
    assert all(e.family == "gsm8k" and e.input == "" and "####" in e.output for e in examples)
    assert len({e.id for e in examples}) == 1319


def test_real_self_instruct_seed_tasks_and_templates():
    path = shared_file("self_instruct/seed_tasks.jsonl", "alpaca/seed_tasks.jsonl", "seed_tasks.jsonl")
    examples = load_self_instruct(str(path))
    assert len(examples) >= 175
    assert len({e.id.split(":")[0] for e in examples}) == 175
    with_input = next(e for e in examples if e.input.strip())
    without_input = next(e for e in examples if not e.input.strip())
    prompt = format_prompt(with_input.instruction, with_input.input)
    assert prompt.startswith("Below is an instruction that describes a task, paired with an input")
    assert f"### Instruction:\n{with_input.instruction}\n\n### Input:\n{with_input.input}\n\n" in prompt
    assert prompt.endswith("### Response:\n")
    prompt = format_prompt(without_input.instruction, without_input.input)
    assert "### Input:" not in prompt and "paired with an input" not in prompt
    assert prompt.endswith(f"### Instruction:\n{without_input.instruction}\n\n### Response:\n")
