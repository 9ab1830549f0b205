"""A mixture's control (`tune.controls`): as many teacher samples per prompt as the mixture has τ_kd, all at
one τ_kd, drawn by the mixture's weights — so what a mixture gains over it is its temperatures'."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from specray.config import load_spec
from specray.data.shards import finalize_shard, read_shard, write_part
from specray.distill.data import MixtureSampler, rows_from_table
from specray.distill.inputs import component_shards
from specray.draft import Draft, plan_control, plan_draft
from specray.keys import shard_key
from specray.report.composition import TEMPERATURE, Composition, control_gains
from specray.specdec.records import CellRecord
from specray.sweep.plan import plan_sweep
from specray.sweep.tune.baselines import Contenders, table3
from tests.conftest import REPO

TAU = 1.0


def _write(key, examples, tag: int) -> None:
    """A shard of `examples` whose response to prompt i is [100 + tag, i]: distinct per sample and prompt."""
    rows = [
        {
            "prompt_id": e.id,
            "prompt": e.instruction,
            "response": f"{tag}-{i}",
            "prompt_token_ids": [1, 1000 + i],
            "response_token_ids": [100 + tag, i],
            "tau": key.tau,
            "seed": key.seed,
            "teacher": key.teacher,
            "finish_reason": "stop",
        }
        for i, e in enumerate(examples)
    ]
    write_part(key, rows)
    finalize_shard(key, [e.id for e in examples])


@pytest.fixture
def smoke():
    """The smoke sweep's plan with its own τ_kd shards and two more teacher samples at τ_kd 1 (seeds + 1
    and + 2) in the test's cache."""
    spec = load_spec(REPO / "sweeps" / "smoke.yaml")
    plan = plan_sweep(spec)
    sample = plan.shards[0]
    for tau, key in sample.keys.items():
        _write(key, sample.examples, int(tau * 10))
    seed, tokens = spec.teacher.seed, spec.teacher.max_new_tokens
    extra = [shard_key(spec, sample.examples, TAU, tokens, seed + j) for j in (1, 2)]
    for j, key in enumerate(extra, start=1):
        _write(key, sample.examples, 50 + j)
    return plan, [sample.keys[TAU], *extra]


def _distinct_per_prompt(draft: Draft, count: int = 600) -> tuple[Counter, set[float]]:
    """Over `count` drawn rows of the draft's training data: distinct responses per prompt, and the τ_kd
    the rows were sampled at."""
    tables = {c: rows_from_table(read_shard(k), k.tau, 64) for c, k in component_shards(draft).items()}
    sampler = MixtureSampler(tables, draft.components, steps=count // 4, batch_size=4, grad_accum=1, seed=0)
    rows = [row for step in range(1, count // 4 + 1) for row in sampler.micro_batch(step, 0)]
    responses: dict[tuple[int, ...], set] = {}
    for row in rows:
        responses.setdefault(row.prompt_ids, set()).add(row.response_ids)
    return Counter(len(r) for r in responses.values()), {row.tau_kd for row in rows}


def test_a_control_reads_as_many_samples_per_prompt_as_its_mixture_at_one_temperature(
    smoke, tmp_path
) -> None:
    plan, samples = smoke
    spec = plan.spec
    weights = [0.5, 0.3, 0.2]
    control = plan_control(spec, samples, weights, "offline", folder=tmp_path / "control")
    assert control.name == "offline/tau_kd=1/samples=0.5,0.3,0.2" and control.tau_kd == TAU
    assert control.components == {0.0: 0.5, 1.0: 0.3, 2.0: 0.2}
    assert [k.seed for k in component_shards(control).values()] == [spec.teacher.seed + j for j in range(3)]

    distinct, taus = _distinct_per_prompt(control)
    assert taus == {TAU}  # one temperature
    assert max(distinct) == 3 and distinct[3] > sum(distinct.values()) / 2  # 3 samples per prompt, read
    # the mixture it controls (here the smoke grid's two τ_kd, weights 1:1, against a 2-sample control)
    mixture = plan_draft(spec, plan.shards[0].keys, "offline", {0.0: 1.0, 1.0: 1.0}, root=tmp_path)
    two = plan_control(spec, samples[:2], [1.0, 1.0], "offline", folder=tmp_path / "two")
    mixed, mixed_taus = _distinct_per_prompt(mixture)
    controlled, _ = _distinct_per_prompt(two)
    assert mixed_taus == {0.0, 1.0} and max(mixed) == max(controlled) == 2

    # keys: not the single τ_kd draft's (whose only sample is the control's sample 0), not another
    # weighting's, the same when planned again
    single = plan_draft(spec, plan.shards[0].keys, "offline", {TAU: 1.0}, root=tmp_path)
    assert control.shards == single.shards and control.key != single.key
    assert plan_control(spec, samples, [0.2, 0.3, 0.5], "offline", folder=tmp_path).key != control.key
    assert plan_control(spec, samples, weights, "offline", folder=tmp_path / "again").key == control.key
    assert plan_control(spec, samples, weights, "offline", 1, folder=tmp_path).name.endswith("/r1")
    assert Draft.from_json(control.to_json()).samples == control.samples


def test_a_control_needs_distinct_samples_of_one_temperature(smoke, tmp_path) -> None:
    plan, samples = smoke
    other = plan.shards[0].keys[0.0]
    with pytest.raises(ValueError, match="distinct shards of one τ_kd"):
        plan_control(plan.spec, [samples[0], other], [1.0, 1.0], "offline", folder=tmp_path)
    with pytest.raises(ValueError, match="distinct shards of one τ_kd"):
        plan_control(plan.spec, [samples[0], samples[0]], [1.0, 1.0], "offline", folder=tmp_path)


def test_table3_gives_each_mixture_its_gain_over_its_control_with_an_interval() -> None:
    from specray.report.table3 import gain_intervals, table3_frame
    from tests.unit.test_verdicts import DIFFICULTY, cell

    # per-prompt speedups: the manual recipe 15% above its control, the tuned mixture 5% below its own
    # (its samples, not its temperatures, would make its gain); 3 replicates ±1% apart
    factors = {"single": 1.0, "manual": 1.15, "tuned": 1.10, "manual control": 1.0, "tuned control": 1.158}
    records, cells = [], []
    for name, factor in factors.items():
        for r, spread in enumerate((-0.01, 0.0, 0.01)):
            draft = f"{name}/r{r}" if r else name
            one = cell(draft, 1.0, DIFFICULTY * (factor + spread)) | {"recipe": name, "replicate": r}
            cells.append(one)
            metrics = {"speedup_model": one["speedup_model"], "acceptance_rate": 0.5}
            records.append(CellRecord(draft, "K", "in_domain", 1.0, "analytic", 4, draft, 0.0, 0.0, metrics))
    labels = {"single": "1", "manual": "0.9+1", "tuned": "0.8:1,1:2", "manual control": "1 × 3 samples"}
    contenders = Contenders(
        "tuned",
        {1.0: "single"},
        {1.0: "manual"},
        labels | {"tuned control": "1 × 2 samples"},
        controls={"manual": {1.0: "manual control"}, "tuned": {1.0: "tuned control"}},
    )
    recipes = {str(c["draft"]): str(c["recipe"]) for c in cells}
    frame = table3(records, contenders, recipes)
    assert frame["manual vs control"].iloc[0] == pytest.approx(0.15, abs=1e-3)
    assert frame["tuned vs control"].iloc[0] == pytest.approx(1.10 / 1.158 - 1, abs=1e-3)
    composition = Composition(frame, pd.DataFrame(cells))
    verdicts = {v.scope.split(",")[0]: v for v in control_gains(composition)}
    manual, tuned = verdicts["manual recipe"], verdicts["tuned mixture"]
    assert manual.verdict == "reproduced" and manual.low > 0 and manual.agreeing == "3/3"
    assert tuned.verdict == "not reproduced" and tuned.high < 0 and tuned.agreeing == "0/3"
    assert {v.claim for v in verdicts.values()} == {TEMPERATURE}

    table = gain_intervals(composition)  # Table 3's own columns, as the report shows them
    (row,) = table.to_dict("records")
    assert row["manual vs control low"] < 0.15 < row["manual vs control high"]
    assert row["tuned vs control verdict"] == "not reproduced"
    shown = table3_frame(table)
    assert shown["manual control"].iloc[0].startswith("1 × 3 samples: ")
    assert shown["manual vs control [95% CI]"].iloc[0].startswith("+15.0% [")
    # without controls: no such rows or columns
    bare = frame.drop(columns=[c for c in frame if "control" in c])
    assert control_gains(Composition(bare, pd.DataFrame(cells))) == []
    assert not any(
        "control" in c for c in table3_frame(gain_intervals(Composition(bare, pd.DataFrame(cells))))
    )
