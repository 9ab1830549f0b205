"""Training replicates (`distill.replicates`, `teacher.replicate_shards`): the drafts they add, their keys and
names, and how the report averages them and judges the claims over them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specray.config import load_spec
from specray.distill.checkpoints import FINISHED_FILE, FinishedDraft, weight_checksums
from specray.draft import Draft
from specray.files import write_json
from specray.keys import train_shard_keys
from specray.report import paired, verdicts
from specray.report.replicates import replicate_means, replicate_spread, variance_table
from specray.specdec.cells import fixed_step_costs
from specray.specdec.records import CellRecord
from specray.sweep.plan import plan_sweep
from specray.sweep.survey import CELLS_DIR, step_costs_file, survey
from tests.conftest import REPO
from tests.unit.test_verdicts import DIFFICULTY, cell

TINY = REPO / "sweeps" / "tiny.yaml"


def test_replicates_add_drafts_and_replicate_0_keeps_the_key_of_a_run_without_them() -> None:
    single = list(plan_sweep(load_spec(TINY)).drafts)
    spec = load_spec(TINY, ["distill.replicates=3"])
    plans = list(plan_sweep(spec).drafts)
    assert len(plans) == 3 * len(single)
    first = [p for p in plans if p.replicate == 0]
    assert [(p.name, p.key, p.folder) for p in first] == [(p.name, p.key, p.folder) for p in single]
    assert len({p.key for p in plans}) == len(plans)  # every replicate its own draft
    again = next(p for p in plans if p.replicate == 2 and p.name.startswith("online/tau_kd=0.6"))
    assert again.name == "online/tau_kd=0.6/r2" and again.folder.name == "online__tau_kd=0.6__r2"
    assert again.recipe == "online/tau_kd=0.6" and again.tags["replicate"] == "2"
    assert (again.paradigm, again.tau_kd, dict(again.mixture), again.replicate) == (
        "online",
        0.6,
        {0.6: 1.0},
        2,
    )
    assert (again.divergence, again.data_source) == ("fkl", "tempspec_teacher")
    assert Draft.from_json(again.to_json()) == again  # the record the report and MLflow read back
    assert again.key_inputs["distill.seed"] == spec.distill.seed + 2
    twin = next(p for p in first if p.name == "online/tau_kd=0.6")
    assert twin.key_inputs["shards"] == again.key_inputs["shards"]  # one teacher sample by default


def test_the_demo_is_replicate_0_of_the_study() -> None:
    """`make study` after `make demo` trains and evaluates only what the demo did not: every shard, draft
    and cell of sweeps/demo.yaml has its key in sweeps/study.yaml's plan."""
    demo = plan_sweep(load_spec(REPO / "sweeps" / "demo.yaml"))
    study = plan_sweep(load_spec(REPO / "sweeps" / "study.yaml"))
    assert [s.keys for s in demo.shards] == [s.keys for s in study.shards]
    assert demo.step_costs_key == study.step_costs_key and demo.baseline.key == study.baseline.key
    assert [d.key for d in demo.drafts] == [d.key for d in study.drafts if d.replicate == 0]
    assert len(study.drafts) == 3 * len(demo.drafts)
    demo_cells = {job.key for job in demo.cell_jobs(None)}
    study_cells = {job.key for job in study.cell_jobs(None)}
    assert demo_cells < study_cells and len(demo_cells) == len(demo.cell_jobs(None))
    assert set(study.spec.eval.temperatures) - set(demo.spec.eval.temperatures) == {1.5, 2.0}


def test_replicate_r_is_the_draft_of_seed_plus_r() -> None:
    """The same weights are the same key: replicate 1 of seed 0 is replicate 0 of seed 1."""
    replicate = list(plan_sweep(load_spec(TINY, ["distill.replicates=2"])).drafts)
    shifted = {p.name: p.key for p in list(plan_sweep(load_spec(TINY, ["distill.seed=1"])).drafts)}
    for plan in (p for p in replicate if p.replicate == 1):
        assert plan.key == shifted[plan.recipe]


def test_replicate_shards_give_each_replicate_its_own_teacher_sample() -> None:
    spec = load_spec(TINY, ["distill.replicates=2", "teacher.replicate_shards=true"])
    samples = [sample.spec for sample in plan_sweep(spec).shards]
    assert [s.teacher.seed for s in samples] == [spec.teacher.seed, spec.teacher.seed + 1]
    keys = [train_shard_keys(s) for s in samples]
    assert {k.digest for k in keys[0].values()}.isdisjoint({k.digest for k in keys[1].values()})
    plans = list(plan_sweep(spec).drafts)
    by_name = {p.name: p for p in plans}
    assert (
        by_name["offline/tau_kd=0.6"].key_inputs["shards"]
        != by_name["offline/tau_kd=0.6/r1"].key_inputs["shards"]
    )
    one = load_spec(TINY, ["distill.replicates=2"])
    assert [sample.spec for sample in plan_sweep(one).shards] == [one]


def test_replicate_0_is_the_spec_itself_and_a_negative_one_is_refused() -> None:
    spec = load_spec(TINY, ["distill.replicates=2"])
    assert spec.for_replicate(0) is spec
    with pytest.raises(ValueError, match="replicate -1: replicates are numbered from 0"):
        spec.for_replicate(-1)


# ---------------------------------------------------------------- the report over replicates


def replicated_grid(bonus: list[float], noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Offline drafts τ_kd 0, 0.5, 1 at τ_dec 0, 0.5, 1 in len(bonus) replicates; in replicate r the
    matched draft (τ_kd = τ_dec) is `bonus[r]` better in block efficiency on every prompt, plus a
    per-replicate shift."""
    rng = np.random.default_rng(seed)
    rows = []
    for r, extra in enumerate(bonus):
        for tau_kd in (0.0, 0.5, 1.0):
            shift = rng.normal(0, noise)
            for tau_dec in (0.0, 0.5, 1.0):
                gain = extra if np.isclose(tau_kd, tau_dec) else 0.0
                recipe = f"offline/tau_kd={tau_kd:g}"
                name = recipe + (f"/r{r}" if r else "")
                row = cell(name, tau_dec, DIFFICULTY + gain + shift, paradigm="offline", tau_kd=tau_kd)
                rows.append(row | {"recipe": recipe, "replicate": r})
    return pd.DataFrame(rows)


def diagonal(frame: pd.DataFrame) -> paired.Verdict:
    (verdict,) = verdicts.diagonal_best(paired.prompt_cells(frame))
    return verdict


def test_an_effect_of_one_lucky_replicate_is_not_reproduced_though_its_own_interval_says_so() -> None:
    frame = replicated_grid([0.5, 0.0, 0.0])
    verdict = diagonal(frame)
    assert verdict.replicates == 3 and verdict.agreeing == "1/3"
    assert verdict.verdict != paired.REPRODUCED and verdict.training == "1/3 replicates agree"
    lucky = diagonal(frame[frame.replicate == 0])  # what a single-seed sweep would have reported
    assert lucky.verdict == paired.REPRODUCED and lucky.training == paired.TRAINING_NOT_MEASURED


def test_an_effect_on_every_replicate_is_reproduced_with_every_replicate_agreeing() -> None:
    verdict = diagonal(replicated_grid([0.5, 0.45, 0.55]))
    assert verdict.verdict == paired.REPRODUCED and verdict.agreeing == "3/3"
    assert verdict.effect > 0 and verdict.low > 0


def test_the_replicated_effect_is_the_mean_of_the_replicates_effects() -> None:
    frame = replicated_grid([0.5, 0.2, 0.3])
    each = [diagonal(frame[frame.replicate == r].assign(replicate=0)).effect for r in range(3)]
    assert diagonal(frame).effect == pytest.approx(np.mean(each))


def test_means_spread_and_variance_split_over_replicates() -> None:
    frame = replicated_grid([0.5, 0.0, 0.0], noise=0.1, seed=3)
    means = replicate_means(frame.drop(columns=[c for c in frame if c.startswith("per_prompt")]))
    assert len(means) == 9 and set(means.replicates) == {3}
    assert set(means.draft) == {"offline/tau_kd=0", "offline/tau_kd=0.5", "offline/tau_kd=1"}
    for (draft, tau_dec), group in frame.groupby(["recipe", "tau_dec"]):
        row = means[(means.draft == draft) & (means.tau_dec == tau_dec)]
        assert row.speedup_model.item() == pytest.approx(group.speedup_model.mean())
    spread = replicate_spread(frame, means)
    matched = spread[np.isclose(spread.tau_kd, spread.tau_dec)]
    expected = (
        frame[np.isclose(frame.tau_kd, frame.tau_dec)].groupby(["recipe", "tau_dec"]).speedup_model.std()
    )
    assert sorted(matched.speedup_model) == pytest.approx(sorted(expected))
    table = variance_table(paired.prompt_cells(frame))
    (row,) = table.to_dict("records")
    assert row["paradigm"] == "offline" and row["replicates"] == 3 and row["cells"] == 9
    assert 0.0 < row["training share"] < 1.0


def test_one_replicate_reads_as_before() -> None:
    frame = replicated_grid([0.5])
    assert replicate_means(frame) is frame
    assert replicate_spread(frame, frame).empty
    assert variance_table(paired.prompt_cells(frame)).empty


def test_a_sweep_reuses_what_another_sweep_under_its_output_directory_made_under_the_same_keys(
    tmp_path: Path,
) -> None:
    """sweeps/study.yaml after sweeps/demo.yaml: the demo's finished drafts are read where they are, its
    step costs and cells are reused (and copied into the study's folder by the run); an unfinished draft or
    a draft of another key is not."""
    out = f"output_dir={tmp_path}"
    demo = plan_sweep(load_spec(REPO / "sweeps" / "demo.yaml", [out]))
    first, second, *_ = demo.drafts
    publish_fake(first.folder, first.key)
    publish_fake(second.folder, "another key")
    costs = fixed_step_costs(load_spec(REPO / "sweeps" / "demo.yaml", ["eval.draft_cost_ratio=0.2"]).eval)
    costs = replace(costs, key=demo.step_costs_key)
    write_json(step_costs_file(demo.folder, demo.step_costs_key), costs.to_json())
    job = demo.cell_jobs(costs)[0]
    record = CellRecord.of(job, costs.cost_ratio(1), 0.0, {"acceptance_rate": 0.5})
    write_json(demo.folder / CELLS_DIR / f"{job.key}.json", record.to_json())

    study = plan_sweep(load_spec(REPO / "sweeps" / "study.yaml", [out]))
    by_name = {d.name: d for d in study.drafts}
    assert by_name[first.name].folder == first.folder  # read in the demo's folder
    assert by_name[second.name].folder == study.drafts_dir / second.folder.name  # another key: trained here
    assert by_name[first.name + "/r1"].folder.parent == study.drafts_dir
    found = survey(study)
    stages = {stage.stage: stage for stage in found.stages}
    assert (stages["drafts"].reused, stages["step costs"].reused) == (1, 1)
    assert found.step_costs == costs and stages["cells"].reused == 1
    assert not (study.folder / CELLS_DIR).exists()  # the survey writes nothing


def publish_fake(folder: Path, key: str) -> None:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    marker = FinishedDraft(fingerprint=key, weights_sha256=weight_checksums(folder))
    (folder / FINISHED_FILE).write_text(json.dumps(marker.to_json()))
