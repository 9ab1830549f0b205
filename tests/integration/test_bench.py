"""`specray bench` as a user runs it: MT-bench's questions at the `mt_bench` workload's temperatures, both
answer files written, the printed figures recomputed from the files alone, greedy answers equal."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.conftest import REPO
from tests.integration.test_cli import specray

pytestmark = pytest.mark.integration

MT_BENCH_TEMPERATURES = {  # FastChat's llm_judge temperature_config, written out independently
    "writing": 0.7,
    "roleplay": 0.7,
    "extraction": 0.0,
    "math": 0.0,
    "coding": 0.0,
    "reasoning": 0.0,
    "stem": 0.1,
    "humanities": 0.1,
}


def figures_from_files(
    spec_file: Path, base_file: Path, tokenizer, categories: set[str]
) -> tuple[float, ...]:
    """Spec-Bench's evaluation, from its description: per-question tokens/s averaged, the baseline's tokens
    counted by re-tokenising its answers less one BOS each, accepted tokens averaged over steps."""
    spec = [json.loads(line) for line in spec_file.read_text().splitlines()]
    base = [json.loads(line) for line in base_file.read_text().splitlines()]
    spec = [r for r in spec if r["category"] in categories]
    base = [r for r in base if r["category"] in categories]
    speeds = [sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in spec]
    base_speeds = [
        sum(len(tokenizer(t).input_ids) - 1 for t in r["choices"][0]["turns"])
        / sum(r["choices"][0]["wall_time"])
        for r in base
    ]
    accepted = [n for r in spec for n in r["choices"][0]["accept_lengths"]]
    base_mean = float(np.mean(base_speeds))
    # the tiny models' greedy answers to real questions are often whitespace: re-tokenised, no tokens at all
    speedup = float(np.mean(speeds)) / base_mean if base_mean > 0 else float("nan")
    return float(np.mean(accepted)), float(np.mean(speeds)), base_mean, speedup


def printed_rows(stdout: str) -> dict[str, list[str]]:
    rows = {}
    for line in stdout.splitlines():
        cells = line.split()
        if len(cells) == 8 and re.fullmatch(r"\d+", cells[1]):
            rows[cells[0]] = cells
    return rows


@pytest.fixture(scope="module")
def smoke_zoo():
    """The smoke sweep's zoo (built once per session, shared with the sweep tests): trained enough that
    its answers are text, unlike the micro zoo's."""
    from specray.config import load_spec
    from specray.models.zoo import build_zoo

    return build_zoo(load_spec(REPO / "sweeps" / "smoke.yaml").models.zoo)


def test_bench_over_mt_bench_writes_answer_files_whose_figures_it_prints(
    tmp_path: Path, smoke_zoo, shared_data: Path
) -> None:
    questions = shared_data / "spec_bench" / "question.jsonl"
    out = tmp_path / "bench"
    args = ["bench", str(questions), "--target", str(smoke_zoo.target), "--draft", str(smoke_zoo.draft)]
    args += ["--workload", "mt_bench", "--categories", "mt_bench", "--limit", "2", "--max-new-tokens", "24"]
    result = specray(*args, "--gamma", "3", "--out", str(out))
    assert result.returncode == 0, result.stderr
    spec_file = out / "target-specray-sd.jsonl"
    base_file = out / "target-vanilla.jsonl"
    spec = [json.loads(line) for line in spec_file.read_text().splitlines()]
    assert len(spec) == 16 and {r["category"] for r in spec} == set(MT_BENCH_TEMPERATURES)
    assert all(r["temperature"] == MT_BENCH_TEMPERATURES[r["category"]] for r in spec)
    assert all(len(r["choices"][0]["turns"]) == 2 for r in spec)  # both MT-bench turns answered
    assert re.search(r"^progress bench", result.stdout + result.stderr, flags=re.M)  # a log, not a TTY

    tokenizer = AutoTokenizer.from_pretrained(smoke_zoo.target)
    rows = printed_rows(result.stdout)
    assert set(rows) == set(MT_BENCH_TEMPERATURES) | {"overall"}
    for group, cells in rows.items():
        members = set(MT_BENCH_TEMPERATURES) if group == "overall" else {group}
        accepted, tps, base_tps, speedup = figures_from_files(spec_file, base_file, tokenizer, members)
        assert float(cells[3]) == pytest.approx(accepted, abs=0.005), group
        assert float(cells[4]) == pytest.approx(tps, abs=0.05), group
        assert float(cells[5]) == pytest.approx(base_tps, abs=0.05), group
        assert float(cells[6]) == pytest.approx(speedup, abs=0.0005, nan_ok=True), group

    base = {json.loads(line)["question_id"]: json.loads(line) for line in base_file.read_text().splitlines()}
    greedy = [r for r in spec if MT_BENCH_TEMPERATURES[r["category"]] == 0.0]
    assert len(greedy) == 8
    for row in greedy:
        assert row["choices"][0]["turns"] == base[row["question_id"]]["choices"][0]["turns"], row[
            "question_id"
        ]
    assert "τ = 0: 8/8 speculative answers equal the baseline's" in result.stdout


def test_bench_refuses_bad_input_before_work(tmp_path: Path, micro_zoo, shared_data: Path) -> None:
    questions = str(shared_data / "spec_bench" / "question.jsonl")
    models = [
        "--target",
        str(micro_zoo.target),
        "--draft",
        str(micro_zoo.draft),
        "--out",
        str(tmp_path / "b"),
    ]
    unknown = specray("bench", questions, *models, "--workload", "mt_bench", "--categories", "poetry")
    assert unknown.returncode == 2 and "unknown category 'poetry'; allowed: mt_bench" in unknown.stderr
    uncovered = specray("bench", questions, *models, "--workload", "mt_bench", "--categories", "qa")
    assert uncovered.returncode == 2 and "no temperature for categories qa" in uncovered.stderr
    bare = tmp_path / "bare-target"
    shutil.copytree(micro_zoo.target, bare)
    for template in bare.glob("chat_template.*"):
        template.unlink()
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    refused = specray("bench", questions, *models[:1], str(bare), *models[2:], "--temperature", "0")
    assert refused.returncode == 2, refused.stderr
    assert f"{bare}: its tokenizer has no chat template" in refused.stderr
    assert not (tmp_path / "b").exists()  # refused before any work
