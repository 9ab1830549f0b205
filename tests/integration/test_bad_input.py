"""Bad input through the real CLI: each case ends with exit code 2 and one `error:` line that names the field
or file and what is wrong, with no traceback, before any work starts (no MLflow run, no Ray, no output).
The case ids are the rows of docs/RELIABILITY.md's bad-input table."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specray.config import load_spec
from specray.data.shards import SHARD_FILE, shard_dir
from specray.keys import train_shard_keys
from tests.conftest import micro_zoo_spec
from tests.sweeps import SMOKE, SPECRAY, run_cli

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Case:
    """`make(tmp_path, zoo)` writes what the case needs and returns the CLI arguments after `specray`;
    the error line must contain every string of `expect(tmp_path)`."""

    make: Callable[[Path, object], list[str]]
    expect: Callable[[Path], list[str]]


def _spec_file(text: str | bytes) -> Callable[[Path, object], list[str]]:
    def make(tmp: Path, zoo: object) -> list[str]:
        path = tmp / "bad.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return ["run", str(path)]

    return make


def _command(command: str, *overrides: str) -> Callable[[Path, object], list[str]]:
    return lambda tmp, zoo: [command, str(SMOKE), f"output_dir={tmp / 'out'}", *overrides]


def _run(*overrides: str) -> Callable[[Path, object], list[str]]:
    return _command("run", *overrides)


def _data_file(name: str, content: bytes | Callable[[Path], None], kind: str = "alpaca"):
    def make(tmp: Path, zoo: object) -> list[str]:
        path = tmp / name
        if callable(content):
            content(path)
        else:
            path.write_bytes(content)
        return _run(f"data.train={{kind: {kind}, path: {path}}}")(tmp, zoo)

    return make


def _models(target: Callable[[Path, object], str], draft: Callable[[Path, object], str] | None = None):
    def make(tmp: Path, zoo) -> list[str]:
        t = target(tmp, zoo)
        d = draft(tmp, zoo) if draft else str(zoo.draft)
        return _run(f"models.target={{name_or_path: {t}}}", f"models.draft={{name_or_path: {d}}}")(tmp, zoo)

    return make


def _corrupt_model(tmp: Path, zoo) -> str:
    path = tmp / "corrupt-model"
    shutil.copytree(zoo.target, path)
    (path / "config.json").write_text("{ not json")
    return str(path)


def _pickle_only_model(tmp: Path, zoo) -> str:
    path = tmp / "pickle-model"
    shutil.copytree(zoo.target, path)
    for weights in path.glob("*.safetensors"):
        weights.rename(weights.with_name("pytorch_model.bin"))
    return str(path)


def _other_vocabulary(tmp: Path, zoo) -> str:
    from specray.models.zoo import build_zoo

    return str(build_zoo(micro_zoo_spec(vocab_size=300), root=tmp / "zoo300").draft)


def _garden_of_other_vocabularies(tmp: Path, zoo) -> list[str]:
    target, draft, other = str(zoo.target), str(zoo.draft), _other_vocabulary(tmp, zoo)
    models = [f"models.target={{name_or_path: {target}}}", f"models.draft={{name_or_path: {draft}}}"]
    garden = f"models.garden=[{{name_or_path: {other}}}, {{name_or_path: {target}}}]"
    return _command("garden", *models, garden, "teacher.temperatures=[1.0]")(tmp, zoo)


BIG = "{hidden_size: 128, num_layers: 4, num_heads: 4, intermediate_size: 256, train_steps: 2, lr: 0.001}"
# a garden whose first model is bigger than its second: every garden case below is refused before work
GARDEN = (
    f"models.zoo.ladder={{big: {BIG}}}",
    "models.garden=[{zoo: big}, {zoo: target}]",
    "teacher.temperatures=[1.0]",
)


def _wrong_schema(path: Path) -> None:
    pq.write_table(pa.table({"question": ["What is 2+2?"], "answer": ["4"]}), path)


ROWS_WITHOUT_OUTPUT = json.dumps([{"instruction": f"task {i}", "input": ""} for i in range(50)]).encode()
ROWS_WITH_EMPTY_OUTPUT = json.dumps([{"instruction": f"task {i}", "output": " "} for i in range(50)]).encode()

CASES = {
    "malformed-yaml": Case(_spec_file("name: x\nteacher: [1, 2\n"), lambda t: [str(t / "bad.yaml"), "YAML"]),
    "non-utf8-spec": Case(_spec_file(b"name: caf\xe9\n"), lambda t: [str(t / "bad.yaml"), "UTF-8"]),
    "unknown-key": Case(_run("eval.gama=3"), lambda t: ["eval.gama", "gamma"]),
    "wrong-type": Case(_run("eval.gamma=four"), lambda t: ["eval.gamma", "integer"]),
    "negative-temperature": Case(
        _run("teacher.temperatures=[-0.5, 1.0]"), lambda t: ["teacher.temperatures"]
    ),
    "absurd-temperature": Case(_run("eval.temperatures=[1000]"), lambda t: ["eval.temperatures", "5"]),
    "gamma-zero": Case(_run("eval.gamma=0"), lambda t: ["eval.gamma", "greater than or equal to 1"]),
    "missing-data-file": Case(
        _run("data.train={kind: alpaca, path: /nonexistent/train.json}"),
        lambda t: ["data.train.path: /nonexistent/train.json: file not found"],
    ),
    "empty-dataset": Case(_data_file("empty.json", b"[]"), lambda t: [str(t / "empty.json"), "0 rows"]),
    "all-rows-invalid": Case(
        _data_file("blank.json", ROWS_WITH_EMPTY_OUTPUT), lambda t: [str(t / "blank.json"), "no usable rows"]
    ),
    "missing-column": Case(
        _data_file("no-output.json", ROWS_WITHOUT_OUTPUT), lambda t: [str(t / "no-output.json"), "output"]
    ),
    "non-utf8-data": Case(
        _data_file("latin1.jsonl", b'{"instruction": "caf\xe9", "output": "x"}\n'),
        lambda t: [str(t / "latin1.jsonl"), "UTF-8"],
    ),
    "parquet-wrong-schema": Case(
        _data_file("wrong.parquet", _wrong_schema, kind="parquet"),
        lambda t: [str(t / "wrong.parquet"), "instruction", "question"],
    ),
    "unknown-test-set": Case(_run("eval.test_sets=[gsm]"), lambda t: ["eval.test_sets", "gsm", "in_domain"]),
    "missing-question-file": Case(
        _run(
            "data.test_sets={bench: {source: {kind: spec_bench, path: /nonexistent/question.jsonl}}}",
            "eval.test_sets=[in_domain, bench]",
        ),
        lambda t: ["data.test_sets.bench.source.path: /nonexistent/question.jsonl: file not found"],
    ),
    "missing-model-dir": Case(
        _models(lambda t, z: str(t / "no-such-model")),
        lambda t: [f"models.target.name_or_path: {t / 'no-such-model'}: model directory not found"],
    ),
    "corrupt-model-dir": Case(_models(_corrupt_model), lambda t: [str(t / "corrupt-model"), "config"]),
    "pickle-only-weights": Case(
        _models(_pickle_only_model), lambda t: [str(t / "pickle-model"), "safetensors"]
    ),
    "vocabulary-mismatch": Case(
        _models(lambda t, z: str(z.target), _other_vocabulary), lambda t: ["different vocabularies"]
    ),
    "garden-not-growing": Case(
        _command("garden", *GARDEN), lambda t: ["models.garden", "grow in size", "big 0.", "target 0."]
    ),
    "garden-tokenizer-mismatch": Case(_garden_of_other_vocabularies, lambda t: ["different vocabularies"]),
    "garden-in-specray-run": Case(
        _run(*GARDEN), lambda t: ["specray run: smoke is a model garden", "specray garden"]
    ),
    "garden-in-a-stage-command": Case(
        _command("generate", *GARDEN),
        lambda t: ["specray generate: smoke is a model garden", "specray garden"],
    ),
}


@pytest.fixture(scope="module")
def refusals(micro_zoo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """Every case through the CLI once, four processes side by side: each is mostly an interpreter's start
    and imports, so the module takes a third of the time it would one case after another."""

    def refuse(case: str) -> tuple[str, tuple[Path, Any]]:
        tmp = tmp_path_factory.mktemp(case)
        args = CASES[case].make(tmp, micro_zoo)
        return case, (tmp, run_cli([SPECRAY, *args, f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}"], tmp))

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(refuse, CASES))


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_is_one_clear_error_before_any_work(
    case: str, refusals: dict[str, tuple[Path, Any]]
) -> None:
    tmp_path, result = refusals[case]
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in CASES[case].expect(tmp_path):
        assert needle in errors[0], errors[0]
    print(f"\n{case}: {errors[0]}")  # shown with pytest -s (docs/RELIABILITY.md quotes these)
    assert not (tmp_path / "mlflow.db").exists()  # refused before MLflow (and Ray) were touched
    assert not (tmp_path / "out" / "smoke" / "drafts").exists()


def test_rows_missing_fields_are_skipped_with_one_warning(tmp_path: Path) -> None:
    rows = [{"instruction": f"task {i}", "input": "", "output": f"answer {i}"} for i in range(40)]
    rows += [{"instruction": "no output"}, {"output": "no instruction"}, {"instruction": 3, "output": "x"}]
    path = tmp_path / "some-bad.json"
    path.write_text(json.dumps(rows))
    sizes = ["data.train_size=20", "data.validation_size=5", "data.in_domain_test_size=5"]
    result = run_cli(
        [SPECRAY, "data", "show", str(SMOKE), f"data.train={{kind: alpaca, path: {path}}}", *sizes], tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "skipped" in line]
    assert len(warnings) == 1 and str(path) in warnings[0] and "3" in warnings[0], result.stderr


def test_a_corrupt_teacher_shard_is_refused_naming_the_file(
    micro_zoo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished shard whose file was damaged afterwards (disk error, a half copy): distillation refuses
    it by its manifest checksum instead of training on it."""
    # a cache of its own: the shard it damages must not be one that later tests of the session read
    monkeypatch.setenv("SPECRAY_CACHE", str(tmp_path / "cache"))
    overrides = [
        f"models.target={{name_or_path: {micro_zoo.target}}}",
        f"models.draft={{name_or_path: {micro_zoo.draft}}}",
        "teacher.temperatures=[1.0]",
        "teacher.max_new_tokens=8",
        "distill.steps=2",
        f"output_dir={tmp_path / 'out'}",
    ]
    generated = run_cli([SPECRAY, "generate", str(SMOKE), *overrides], tmp_path)
    assert generated.returncode == 0, generated.stderr[-3000:]
    spec = load_spec(SMOKE, overrides)
    shard = shard_dir(train_shard_keys(spec)[1.0]) / SHARD_FILE
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated
    options = ["--paradigm", "offline", "--tau-kd", "1.0", "--output", str(tmp_path / "draft")]
    result = run_cli([SPECRAY, "distill", str(SMOKE), *overrides, *options], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(shard) in errors[0], result.stderr[-3000:]
    print(f"\ncorrupt shard: {errors[0]}")
    assert not (tmp_path / "draft").exists()
