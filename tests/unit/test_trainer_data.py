"""`specray export-data`: a run's teacher shards as SpecForge and speculators training files.

The files are held to the trainers' own rules (`tests/trainer_rules.py`).
"""

from __future__ import annotations

import json

import pytest

from specray.config import load_spec
from specray.data.shards import finalize_shard, write_part
from specray.errors import SpecError
from specray.serving.trainer_data import check_export, export_data, recipe_rows
from specray.serving.trainer_recipes import Recipe, RunData, choose_recipes
from specray.sweep.plan import plan_sweep
from tests.conftest import REPO
from tests.trainer_rules import specforge_problems, speculators_problems


@pytest.fixture
def run() -> RunData:
    """The smoke sweep's spec with its τ_kd shards in the test's cache (rows made up here: one response
    per train prompt, the third blank at τ_kd 1)."""
    spec = load_spec(REPO / "sweeps" / "smoke.yaml")
    plan = plan_sweep(spec)
    shards = plan.shards[0]
    for tau, key in shards.keys.items():
        rows = [
            {
                "prompt_id": e.id,
                "prompt": f"### Instruction:\n{e.instruction}\n\n### Response:\n",
                "response": " " if (tau == 1.0 and i == 2) else f"answer {i} at {tau:g}",
                "prompt_token_ids": [1, 5, 6, 7][: 2 + i % 3],
                "response_token_ids": [9, 10, 2][: 1 + i % 3],
                "tau": tau,
                "seed": 17,
                "teacher": key.teacher,
                "finish_reason": "stop",
            }
            for i, e in enumerate(shards.examples)
        ]
        write_part(key, rows)
        finalize_shard(key, [e.id for e in shards.examples])
    recipes = {d.recipe: dict(d.mixture) for d in plan.drafts}
    return RunData(spec, recipes, "outputs/smoke", "sweep", ("tau_kd=0", "tau_kd=1"))


def test_every_tau_kd_becomes_files_both_trainers_accept_with_counts_and_hashes(run, tmp_path) -> None:
    written = export_data(run, choose_recipes(run), tmp_path)
    manifest = written.manifest
    assert [r["name"] for r in manifest["recipes"]] == ["tau_kd=0", "tau_kd=1"]
    train = len(run.spec and plan_sweep(run.spec).shards[0].examples)
    zero, one = manifest["recipes"]
    assert zero["rows_per_tau_kd"] == {"0": train} and zero["skipped_blank_responses"] == 0
    assert one["rows_per_tau_kd"] == {"1": train - 1} and one["skipped_blank_responses"] == 1
    assert {tau: shard["rows"] for tau, shard in manifest["shards"].items()} == {"0": train, "1": train}
    for recipe in manifest["recipes"]:
        assert specforge_problems(tmp_path / recipe["files"]["specforge"]["path"]) == []
        assert speculators_problems(tmp_path / recipe["files"]["speculators"]["path"]) == []
    row = json.loads((tmp_path / one["files"]["specforge"]["path"]).read_text().splitlines()[0])
    assert row["metadata"]["tau_kd"] == 1.0 and row["metadata"]["teacher"] == manifest["teacher"]["model"]
    tokens = run.spec.teacher.max_new_tokens
    assert row["metadata"]["sampling_params"] == {
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": tokens, "seed": 17
    }  # fmt: skip
    assert check_export(tmp_path) == []
    assert "specforge train --config" in (tmp_path / "README.md").read_text()


def test_the_trainers_rules_refuse_what_they_refuse(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    rows = [
        {"id": "a", "status": "success", "conversations": [{"role": "assistant", "content": "x"}]},
        {"id": "a", "status": "success", "conversations": [{"role": "user", "content": " "}]},
    ]
    bad.write_text("".join(json.dumps(row) + "\n" for row in rows))
    problems = specforge_problems(bad)
    assert "line 1: message 0 has role 'assistant', expected 'user'" in problems
    assert {"line 2: duplicate id a", "line 2: message 0 content must be a non-empty string"} <= set(problems)
    assert "line 2: conversation must end with an assistant message" in problems
    metadata = {"usage": {"prompt_tokens": 1}, "sampling_params": {"temperature": 0.5}, "tau_kd": 1.0}
    row = {"id": "b", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 0], "metadata": metadata}
    bad.write_text(json.dumps(row) + "\n")
    assert speculators_problems(bad) == [
        "b: loss_mask is not 0 over the prompt and 1 over the response",
        "b: sampled at another temperature than its τ_kd",
    ]


def test_a_changed_row_or_a_replaced_shard_fails_the_check(run, tmp_path) -> None:
    written = export_data(run, choose_recipes(run, [0.0]), tmp_path)
    path = tmp_path / written.manifest["recipes"][0]["files"]["speculators"]["path"]
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    row["metadata"]["tau_kd"] = 1.0
    path.write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    problems = check_export(tmp_path)
    assert problems[0] == f"{path.relative_to(tmp_path)}: sha256 differs from manifest.json"
    assert "rows per τ_kd" in problems[1]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["shards"]["0"]["sha256"] = "0" * 64  # the cache now holds another shard under that key
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert any("not the shard the export was written from" in p for p in check_export(tmp_path))


def test_a_mixture_keeps_its_proportions_one_row_per_prompt_and_the_same_file_twice(run) -> None:
    from specray.data.shards import read_shard

    keys = plan_sweep(run.spec).shards[0].keys
    tables = {tau: read_shard(keys[tau]).to_pylist() for tau in (0.0, 1.0)}
    recipe = Recipe("mix=0:1,1:3", {0.0: 1.0, 1.0: 3.0})
    rows, skipped = recipe_rows(recipe, tables, 0)
    assert len({r["prompt_id"] for r in rows}) == len(rows) == len(tables[0.0]) - skipped
    share = sum(r["tau"] == 1.0 for r in rows) / len(rows)
    assert 0.6 < share < 0.9  # 0.75 expected; 64 prompts
    assert recipe_rows(recipe, tables, 0) == (rows, skipped)  # seeded by the recipe


def test_bad_requests_are_one_line_naming_what_is_allowed(run, tmp_path) -> None:
    with pytest.raises(SpecError, match=r"^--tau-kd 0.5: not in the run's τ_kd grid \(0, 1\)$"):
        choose_recipes(run, [0.5])
    with pytest.raises(SpecError, match=r"^--recipe 'tuned': not a recipe of the run \(offline/tau_kd=0, "):
        choose_recipes(run, names=["tuned"])
    assert choose_recipes(run, names=["0:1,1:1"])[0].mixture == {0.0: 1.0, 1.0: 1.0}
    assert choose_recipes(run, names=["tau_kd=1"])[0].name == "tau_kd=1"
    with pytest.raises(SpecError, match=r"^--format 'sharegpt': choose from specforge, speculators$"):
        export_data(run, choose_recipes(run), tmp_path, ["sharegpt"])
