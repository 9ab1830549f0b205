"""DistillSpec's grid axes (`distill.divergence`, `distill.data_sources` as lists): every online draft is
(τ_kd or mixture, divergence, data source) with its own key, name, folder and tags, and a one-value spec
keeps the names and keys it had before the lists existed."""

from __future__ import annotations

import pytest

from specray.config import SweepSpec, load_spec
from specray.draft import Draft
from specray.errors import SpecError
from specray.keys import digest, draft_key_inputs, spec_key
from specray.sweep.plan import plan_sweep
from tests.conftest import REPO

SMOKE = REPO / "sweeps" / "smoke.yaml"
GRID = ["distill.divergence=[fkl, tvd]", "distill.data_sources=[gkd, {fixed: 0.5, student: 0.5}]"]

# The smoke sweep's drafts as they were named before the grid axes existed, and a digest of the recipe
# part of each key (model ids and shard digests left out: they move with the zoo and data recipes, which
# other tests pin), first computed by the code before the lists existed and re-pinned once at format
# version 2 (`keys.FORMAT_VERSION`). A change here retrains every cached draft: decide it, do not just update
# the values.
SMOKE_DRAFTS = {
    "offline/tau_kd=0": ("offline__tau_kd=0", "19c40e6b5437e0181a19"),
    "offline/tau_kd=1": ("offline__tau_kd=1", "96c7c1ab236d10977f30"),
    "online/tau_kd=0": ("online__tau_kd=0", "591a9ba2fc5f9c72a69e"),
    "online/tau_kd=1": ("online__tau_kd=1", "7b9b14762e8965ba0d7d"),
}


def _recipe_digest(plan: Draft) -> str:
    moving = {"student", "target", "shards"}
    return digest({k: v for k, v in plan.key_inputs.items() if k not in moving})


def _online(plans: list[Draft]) -> list[Draft]:
    return [p for p in plans if p.paradigm == "online"]


def test_a_one_value_spec_keeps_its_names_folders_and_keys() -> None:
    plans = list(plan_sweep(load_spec(SMOKE)).drafts)
    observed = {p.name: (p.folder.name, _recipe_digest(p)) for p in plans}
    assert observed == SMOKE_DRAFTS
    online = _online(plans)[0]
    assert online.key_inputs["distill.divergence"] == "fkl"  # a value, not a list of one
    assert online.key_inputs["distill.data_sources"] == "tempspec_teacher"
    assert online.tags["divergence"] == "fkl" and online.tags["data_source"] == "tempspec_teacher"
    lists_of_one = load_spec(SMOKE, ["distill.divergence=[fkl]", "distill.data_sources=[tempspec_teacher]"])
    assert [(p.name, p.key) for p in list(plan_sweep(lists_of_one).drafts)] == [
        (p.name, p.key) for p in plans
    ]


def test_every_divergence_and_source_pair_is_its_own_draft() -> None:
    spec = load_spec(SMOKE, GRID)
    plans = list(plan_sweep(spec).drafts)
    offline = [p for p in plans if p.paradigm == "offline"]
    assert [p.key for p in offline] == [
        p.key for p in list(plan_sweep(load_spec(SMOKE)).drafts) if p.paradigm == "offline"
    ]
    assert all(p.divergence == p.data_source == "" for p in offline)  # SeqKD on the shards, as before
    online = _online(plans)
    assert len(online) == 2 * 2 * len(spec.teacher.temperatures)
    assert len({p.key for p in online}) == len(online)
    by_name = {p.name: p for p in online}
    tvd_gkd = by_name["online/tau_kd=1/tvd/gkd"]
    assert tvd_gkd.folder.name == "online__tau_kd=1__tvd__gkd"
    assert tvd_gkd.tags | {"divergence": "tvd", "data_source": "gkd"} == tvd_gkd.tags
    assert tvd_gkd.divergence == "tvd" and tvd_gkd.recipe == "online/tau_kd=1/tvd/gkd"
    mixed = by_name["online/tau_kd=0/fkl/fixed0.5_student0.5"]
    assert mixed.key_inputs["distill.data_sources"] == {"fixed": 0.5, "student": 0.5}
    assert mixed.tags["data_source"] == "fixed0.5_student0.5"


def test_a_grid_draft_has_the_key_of_the_one_value_spec_with_its_values() -> None:
    """The cache knows a draft however it was asked for: a 2 × 2 grid reuses a one-value sweep's draft."""
    grid = {p.name: p.key for p in list(plan_sweep(load_spec(SMOKE, GRID)).drafts)}
    single = load_spec(SMOKE, ["distill.divergence=tvd", "distill.data_sources=gkd"])
    for plan in _online(list(plan_sweep(single).drafts)):
        assert grid[f"{plan.name}/tvd/gkd"] == plan.key


def test_only_the_varied_axis_is_in_the_name() -> None:
    divergences = _online(list(plan_sweep(load_spec(SMOKE, ["distill.divergence=[rkl, jsd]"])).drafts))
    assert [p.name for p in divergences] == [f"online/tau_kd={t}/{d}" for t in (0, 1) for d in ("rkl", "jsd")]
    assert {p.data_source for p in divergences} == {"tempspec_teacher"}
    sources = _online(list(plan_sweep(load_spec(SMOKE, ["distill.data_sources=[seqkd, imitkd]"])).drafts))
    assert [p.name for p in sources] == [
        f"online/tau_kd={t}/{s}" for t in (0, 1) for s in ("seqkd", "imitkd")
    ]
    replicated = list(plan_sweep(load_spec(SMOKE, [*GRID, "distill.replicates=2"])).drafts)
    again = next(p for p in replicated if p.name == "online/tau_kd=1/tvd/gkd/r1")
    assert again.recipe == "online/tau_kd=1/tvd/gkd" and again.key_inputs["distill.seed"] == 1


def test_a_draft_spec_has_one_value_of_each_axis_and_the_spec_key_has_the_lists() -> None:
    spec = load_spec(SMOKE, GRID)
    one = spec.for_draft("online", 0, "tvd", "fixed0.5_student0.5")
    assert one.distill.divergence == "tvd" and one.distill.sources.fixed == 0.5
    with pytest.raises(ValueError, match="needs one divergence and data source"):
        draft_key_inputs(spec, "online", {1.0: 1.0}, {})
    with pytest.raises(ValueError, match="grid axis"):
        _ = spec.distill.sources
    assert spec_key(spec) != spec_key(load_spec(SMOKE, GRID[:1])) != spec_key(load_spec(SMOKE))
    with pytest.raises(ValueError, match=r"\(kl, gkd\) is not a draft of this sweep"):
        spec.for_variant("kl", "gkd")
    single = load_spec(SMOKE)
    assert single.for_variant("fkl", "tempspec_teacher") is single


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "distill.divergence=[fkl, kl]",
            "distill.divergence.1: Input should be 'fkl', 'rkl', 'jsd' or 'tvd' (got \"kl\")",
        ),
        ("distill.divergence=kl", "distill.divergence: Input should be 'fkl', 'rkl', 'jsd' or 'tvd'"),
        (
            "distill.data_sources=[gkd, distillspec]",
            "distill.data_sources.1.preset: Input should be 'seqkd', 'supervised_kd', 'imitkd', 'f_distill', "
            "'gkd', 'tempspec' or 'tempspec_teacher' (got \"distillspec\")",
        ),
        ("distill.data_sources=[gkd, {teacher: 1}]", "distill.data_sources.1.fractions.teacher: unknown key"),
        ("distill.divergence=[tvd, tvd]", "distill.divergence: lists tvd more than once"),
        ("distill.data_sources=[]", "distill.data_sources: needs at least one value"),
    ],
)
def test_a_bad_value_in_a_list_is_one_line_naming_the_field_and_the_valid_values(
    override: str, message: str
) -> None:
    with pytest.raises(SpecError) as error:
        load_spec(SMOKE, [override])
    (line,) = str(error.value).splitlines()
    assert message in line


def test_lists_round_trip_through_the_saved_spec() -> None:
    spec = load_spec(SMOKE, GRID)
    assert SweepSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_commands_that_train_one_online_draft_refuse_a_list_naming_the_field() -> None:
    from specray.sweep.tune.space import check_tune

    spec = load_spec(SMOKE, GRID)
    with pytest.raises(SpecError) as error:
        check_tune(spec)
    text = str(error.value)
    assert "distill.divergence: specray tune trains one value" in text
    assert "distill.data_sources: specray tune trains one value" in text
    assert load_spec(SMOKE).distill.grid_axes_problems("specray tune") == []
