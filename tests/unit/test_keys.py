"""Result keys: every spec field is classified, and changing a field changes exactly the keys its
classification says (shards, drafts, cells, the cost ratio, the training curves) and no others."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from specray.config import SweepSpec, load_spec
from specray.draft import one_draft
from specray.keys import (
    FIELDS,
    Direct,
    cell_key_inputs,
    classification,
    cost_ratio_inputs,
    curve_inputs,
    describe_change,
    digest,
    leaf_fields,
    spec_key,
    train_shard_keys,
)
from tests.conftest import REPO
from tests.plans import prompts_fingerprints


def fingerprint(spec, paradigm: str, mixture: dict) -> str:  # noqa: ANN001
    """A draft's key, as the plan computes it (`specray.draft.plan_draft`)."""
    return one_draft(spec, paradigm, mixture, Path("draft")).key


SMOKE = load_spec(REPO / "sweeps" / "smoke.yaml")
# Fields whose change cannot be tried alone on the synthetic smoke spec: the loader options of a file
# source (a synthetic source has no path, split, columns or categories), the model fields that are one
# choice between sources (zoo, name, GGUF file, cut or fresh draft: their key input, the model id, is tested
# in test_model_ids and the tests after it), vLLM's
# tensor parallelism (it must equal teacher.num_gpus), and the named test sets and the workload, which need
# a question file (tested below: `test_a_named_test_set_...`, `test_a_workload_...`).
FILE_SOURCE_OPTIONS = {
    f"data.{src}.{name}"
    for src in ("train", "out_of_domain")
    for name in ("kind", "path", "split", "columns", "categories")
}
MODEL_CHOICE = {
    f"models.{role}.{name}"
    for role in ("target", "draft")
    for name in ("zoo", "name_or_path", "gguf", "cut", "fresh")
}
NEED_QUESTIONS = {"data.test_sets", "eval.workload"}
# a garden needs a ladder of zoo targets ending in the target; tests/unit/test_garden.py checks their keys
GARDEN = {"models.garden", "models.zoo.ladder"}
INERT_ON_SMOKE = (
    FILE_SOURCE_OPTIONS | MODEL_CHOICE | NEED_QUESTIONS | GARDEN | {"teacher.vllm.tensor_parallel_size"}
)


def test_every_spec_field_is_classified_for_the_result_keys() -> None:
    unclassified = [path for path in leaf_fields() if classification(path) is None]
    assert not unclassified, (
        f"classify these spec fields in specray/keys/fields.py FIELDS (what results do they change?): "
        f"{unclassified}"
    )
    leaves = leaf_fields()
    stale = [
        p for p in FIELDS if not any(leaf == p or (p.endswith(".") and leaf.startswith(p)) for leaf in leaves)
    ]
    assert not stale, f"FIELDS entries for fields that do not exist: {stale}"


def _with(spec: SweepSpec, path: str, value: Any) -> SweepSpec:
    raw = spec.model_dump(mode="json")
    node = raw
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    return SweepSpec.model_validate(raw)


def _candidates(value: Any) -> list[Any]:
    """Values to try in place of `value`, most natural first."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1, value * 2]
    if isinstance(value, float):
        return [value + 1.0, value * 0.5, value + 0.1, 0.5, 0.25]
    if isinstance(value, str):
        return [
            "vllm",
            "tempspec",
            "sequence",
            "float32",
            "bfloat16",
            "jsd",
            "rkl",
            "online",
            "offline",
            "diagonal",
            "random",
            "subset",
            "chat",
            "none",
            value + "x",
        ]
    if value is None:
        return [0.3, 2, 64, 4096, "x", "127.0.0.1:6379", ["word_problem"]]
    if isinstance(value, list):
        lists = [value[:-1], [*value, 0.5], [*value, 7], [*value, "out_of_domain"], ["word_problem"]]
        lists += [["arithmetic"], ["online"], ["rkl", "tvd"], ["exp"], [*value, 2]]
        return lists + [[{"weights": {"0.0": 1.0, "1.0": 1.0}}]]
    if isinstance(value, dict):
        return [{**value, "x": "y"}]
    return []


def _perturbed(spec: SweepSpec, path: str) -> SweepSpec | None:
    node: Any = spec
    for part in path.split("."):
        node = getattr(node, part)
    current = node.model_dump(mode="json") if hasattr(node, "model_dump") else copy.deepcopy(node)
    for candidate in _candidates(current):
        if candidate == current:
            continue
        try:
            changed = _with(spec, path, candidate)
        except (ValidationError, KeyError, TypeError):
            continue
        if changed != spec:
            return changed
    return None


def _keys(spec: SweepSpec) -> dict[str, str]:
    """One key of each kind the classification speaks of, on a fixed corner of the grid."""
    shards = train_shard_keys(spec)
    tau = min(shards)
    fingerprints = prompts_fingerprints(_with(spec, "eval.test_sets", ["in_domain", "out_of_domain"]))
    c = spec.eval.draft_cost_ratio if spec.eval.draft_cost_ratio is not None else 0.12345

    def cells(estimator: str) -> str:  # both test sets: out-of-domain settings change only theirs
        return "".join(
            digest(cell_key_inputs(spec, "DRAFT", fingerprints[test_set], test_set, 1.0, estimator, 3, c))
            for test_set in ("in_domain", "out_of_domain")
        )

    return {
        "shard": shards[tau].digest,
        "offline": fingerprint(spec, "offline", {tau: 1.0}),
        "online": fingerprint(spec, "online", {tau: 1.0}),
        "analytic": cells("analytic"),
        "empirical": cells("empirical"),
        "cost_ratio": digest(cost_ratio_inputs(spec)),
        "curves": digest(curve_inputs(spec)),
    }


_BASE_KEYS: dict[str, dict[str, str]] = {}


def _keys_of_base(spec: SweepSpec) -> dict[str, str]:
    """`_keys` of an unchanged base spec, computed once per base (a few bases serve every field)."""
    dumped = spec.model_dump_json()
    if dumped not in _BASE_KEYS:
        _BASE_KEYS[dumped] = _keys(spec)
    return _BASE_KEYS[dumped]


def _expected(roles: frozenset[str]) -> dict[str, bool]:
    return {
        "shard": "shard" in roles,
        "offline": bool(roles & {"shard", "draft"}),
        "online": bool(roles & {"shard", "draft", "draft:online"}),
        "analytic": bool(roles & {"cell", "cell:analytic"}),
        "empirical": bool(roles & {"cell", "cell:empirical"}),
        "cost_ratio": "cost_ratio" in roles,
        "curves": "curves" in roles,
    }


def _base(path: str) -> SweepSpec:
    """The spec a field matters in: vLLM settings under the vLLM engine, JSD's β under JSD."""
    if path.startswith("teacher.vllm.") or path == "teacher.engine":
        on_gpu = _with(SMOKE, "teacher.num_gpus", 1.0)
        return on_gpu if path == "teacher.engine" else _with(on_gpu, "teacher.engine", "vllm")
    if path == "distill.jsd_beta":
        return _with(SMOKE, "distill.divergence", "jsd")
    return SMOKE


@pytest.mark.parametrize("path", [p for p in leaf_fields() if p not in INERT_ON_SMOKE])
def test_changing_a_field_changes_exactly_the_keys_it_is_classified_for(path: str) -> None:
    base = _base(path)
    changed = _perturbed(base, path)
    assert changed is not None, f"no valid change of {path} found: extend _candidates"
    before, after = _keys_of_base(base), _keys(changed)
    observed = {kind: before[kind] != after[kind] for kind in before}
    assert observed == _expected(classification(path).roles), path


def test_the_un_jsd_beta_does_not_retrain_other_divergences() -> None:
    assert fingerprint(SMOKE, "online", {0.0: 1}) == fingerprint(
        _with(SMOKE, "distill.jsd_beta", 0.2), "online", {0.0: 1}
    )


def test_online_drafts_are_keyed_by_the_steps_they_train() -> None:
    online_600 = _with(SMOKE, "distill.online_steps", SMOKE.distill.steps * 3)
    assert fingerprint(online_600, "offline", {0.0: 1}) == fingerprint(SMOKE, "offline", {0.0: 1})
    assert fingerprint(online_600, "online", {0.0: 1}) != fingerprint(SMOKE, "online", {0.0: 1})
    all_600 = _with(SMOKE, "distill.steps", SMOKE.distill.steps * 3)  # the same online draft, made either way
    assert fingerprint(online_600, "online", {0.0: 1}) == fingerprint(all_600, "online", {0.0: 1})
    fewer_offline = _with(online_600, "distill.steps", SMOKE.distill.steps + 1)
    assert fingerprint(fewer_offline, "online", {0.0: 1}) == fingerprint(online_600, "online", {0.0: 1})


def test_spec_key_ignores_where_and_how_it_runs_but_not_what_it_computes() -> None:
    assert spec_key(SMOKE) == spec_key(_with(SMOKE, "tracking.uri", "http://127.0.0.1:5000"))
    assert spec_key(SMOKE) == spec_key(_with(SMOKE, "eval.replicas", 3))
    assert spec_key(SMOKE) == spec_key(_with(SMOKE, "tune.num_samples", 9))
    assert spec_key(SMOKE, with_tune=True) != spec_key(_with(SMOKE, "tune.num_samples", 9), with_tune=True)
    assert spec_key(SMOKE) != spec_key(_with(SMOKE, "eval.gamma", [3, 5]))
    assert spec_key(SMOKE) != spec_key(_with(SMOKE, "distill.divergence", "tvd"))


def test_model_ids_name_zoo_entries_by_recipe_and_others_by_name() -> None:
    from specray.models.sources import model_id

    raw = SMOKE.model_dump(mode="json")
    raw["models"]["target"] |= {"zoo": None, "name_or_path": "org/model"}
    named = SweepSpec.model_validate(raw)
    assert model_id(named.models.target, named.models) == "org/model"
    assert model_id(SMOKE.models.target, SMOKE.models).startswith("zoo/")
    assert fingerprint(named, "online", {0.0: 1}) != fingerprint(SMOKE, "online", {0.0: 1})


def _with_models(target: dict, draft: dict | None = None) -> SweepSpec:
    raw = SMOKE.model_dump(mode="json")
    raw["models"]["target"] = target
    raw["models"]["draft"] = draft or raw["models"]["draft"]
    return SweepSpec.model_validate(raw)


def test_a_gguf_target_is_named_by_its_content_not_its_path(tmp_path: Path) -> None:
    """Moving the file keeps every key; another file (one byte differs) changes the target's keys."""
    first, moved, other = tmp_path / "a.gguf", tmp_path / "elsewhere" / "b.gguf", tmp_path / "c.gguf"
    moved.parent.mkdir()
    first.write_bytes(b"GGUF" + bytes(64))
    moved.write_bytes(first.read_bytes())
    other.write_bytes(b"GGUF" + bytes(63) + b"\x01")
    specs = [_with_models({"gguf": str(path)}) for path in (first, moved, other)]
    keys = [_keys(spec) for spec in specs]
    assert keys[0] == keys[1]
    changed = {kind for kind in keys[0] if keys[0][kind] != keys[2][kind]}
    assert changed == {"shard", "offline", "online", "analytic", "empirical", "cost_ratio"}


def test_a_derived_draft_is_named_by_its_recipe_and_its_target(tmp_path: Path) -> None:
    target = tmp_path / "t.gguf"
    target.write_bytes(b"GGUF" + bytes(64))
    two, three = ({"cut": {"layers": n}} for n in (2, 3))
    fresh = {"fresh": {"hidden_size": 64, "num_layers": 1, "num_heads": 2, "intermediate_size": 128}}
    keys = [_keys(_with_models({"gguf": str(target)}, draft)) for draft in (two, three, fresh)]
    student_only = {"offline", "online", "cost_ratio"}  # cells follow through the draft's key
    for other in keys[1:]:
        assert {kind for kind in keys[0] if keys[0][kind] != other[kind]} == student_only
    from specray.models.sources import model_id

    spec = _with_models({"gguf": str(target)}, two)
    assert (
        model_id(spec.models.draft, spec.models)
        == f"cut(layers=2)/{model_id(spec.models.target, spec.models)}"
    )


def test_only_a_draft_is_made_from_the_target() -> None:
    with pytest.raises(ValidationError, match="only the draft can be made from the target"):
        _with_models({"cut": {"layers": 2}})
    with pytest.raises(ValidationError, match="exactly one of"):
        _with_models({"gguf": "x.gguf", "zoo": "target"})


def test_a_mixture_key_does_not_depend_on_the_scale_of_its_weights() -> None:
    assert fingerprint(SMOKE, "offline", {0.0: 1, 1.0: 2}) == fingerprint(SMOKE, "offline", {0.0: 2, 1.0: 4})
    assert fingerprint(SMOKE, "offline", {0.0: 1, 1.0: 2}) != fingerprint(SMOKE, "offline", {0.0: 1, 1.0: 1})


def test_a_change_is_described_by_its_fields() -> None:
    old = {"eval.gamma": 3, "distill.divergence": "fkl", "draft": "a" * 20}
    new = {"eval.gamma": 6, "distill.divergence": "fkl", "draft": "b" * 20}
    assert describe_change(old, new) == f"draft {'a' * 8} → {'b' * 8}, eval.gamma 3 → 6"
    assert describe_change({}, new) == "new"


def test_direct_fields_are_real_leaves() -> None:
    leaves = set(leaf_fields())
    for path, entry in FIELDS.items():
        if isinstance(entry, Direct) and not path.endswith("."):
            assert path in leaves, path


@pytest.mark.parametrize(
    ("path", "values"), [("distill.divergence", ["fkl", "tvd"]), ("distill.data_sources", ["gkd", "seqkd"])]
)
def test_a_list_form_is_a_grid_axis_whose_drafts_are_keyed_by_one_value(path: str, values: list) -> None:
    """One value: in the online drafts' keys. A list: which online drafts exist (`grid`), each keyed by its
    own single value, so no key ever holds the list."""
    from specray.sweep.plan import plan_sweep

    assert classification(path).roles == {"draft:online", "grid"}
    listed = _with(SMOKE, path, values)
    online = [p for p in list(plan_sweep(listed).drafts) if p.paradigm == "online"]
    assert sorted({p.key_inputs[path] for p in online}) == sorted(values)
    assert len({p.key for p in online}) == len(online) == len(values) * len(SMOKE.teacher.temperatures)
    assert spec_key(listed) != spec_key(SMOKE)
