"""Sweep specs: every shipped YAML validates; every bad value fails with its field path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specray.config import (
    DataSpec,
    ModelsSpec,
    SpecError,
    SweepSpec,
    dump_spec,
    load_raw,
    load_spec,
    validate_part,
)
from tests.conftest import REPO

SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
PART_MODELS = {"models": ModelsSpec, "data": DataSpec}


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_validates(path: Path) -> None:
    spec = load_spec(path)
    assert spec.name
    # the resolved dump is itself a valid spec with the same content (round trip)
    again = SweepSpec.model_validate(yaml.safe_load(dump_spec(spec)))
    assert again == spec


@pytest.mark.parametrize("path", sorted((REPO / "configs").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_config_part_validates(path: Path) -> None:
    section = path.parent.name
    if section in PART_MODELS:
        validate_part(PART_MODELS[section], path)
    else:  # cluster parts override resources of a whole sweep: apply one on top of the smoke sweep
        raw = load_raw(REPO / "sweeps" / "smoke.yaml")
        part = load_raw(path)
        for key, value in part.items():
            raw[key] = {**raw.get(key, {}), **value}
        SweepSpec.model_validate(raw)


def test_tiny_is_the_full_paper_grid() -> None:
    spec = load_spec(REPO / "sweeps" / "tiny.yaml")
    assert spec.teacher.temperatures == [round(0.1 * i, 1) for i in range(11)]
    assert spec.distill.paradigms == ["offline", "online"]
    assert spec.eval.temperatures == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0]
    assert spec.models.target.zoo == "target" and spec.models.draft.zoo == "draft"
    assert spec.experiment == "tiny"


def _write_sweep(tmp_path: Path, edit) -> Path:
    raw = load_raw(REPO / "sweeps" / "smoke.yaml")
    edit(raw)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("edit", "field", "allowed"),
    [
        (
            lambda r: r["teacher"].update(temperatures=[-0.5]),
            "teacher.temperatures.0",
            "greater than or equal to 0",
        ),
        (lambda r: r["teacher"].update(temperatures=[]), "teacher.temperatures", "at least 1"),
        (lambda r: r["teacher"].update(temperatures=[0.5, 0.5]), "teacher.temperatures", "duplicates"),
        (lambda r: r["eval"].update(temperatures=[100.0]), "eval.temperatures.0", "less than or equal to 5"),
        (lambda r: r["eval"].update(gamma=0), "eval.gamma.0", "greater than or equal to 1"),
        (
            lambda r: r["distill"].update(onpolicy_fraction=1.5),
            "distill.onpolicy_fraction",
            "less than or equal",
        ),
        (
            lambda r: r["distill"].update(divergence="kl"),
            "distill.divergence",
            "'fkl', 'rkl', 'jsd' or 'tvd'",
        ),
        (lambda r: r["teacher"].update(engine="tgi"), "teacher.engine", "'transformers' or 'vllm'"),
        (lambda r: r["distill"].update(steps="many"), "distill.steps", "valid integer"),
        (lambda r: r["eval"].update(gamam=3), "eval.gamam", "unknown key (allowed: "),
        (lambda r: r.update(evaluation={}), "evaluation", "unknown key (allowed: data, distill, eval"),
        (lambda r: r["models"].update(target={}), "models.target", "exactly one of 'zoo'"),
        (lambda r: r["data"].update(train={"kind": "gsm8k"}), "data.train", "needs 'path'"),
        (lambda r: r["eval"].update(empirical_temperatures=[0.4]), "(top level)", "not in eval.temperatures"),
        (lambda r: r.update(name="has space"), "name", "should match pattern"),
        (lambda r: r["teacher"].update(engine="vllm"), "teacher", "must equal vllm.tensor_parallel_size"),
    ],
)
def test_bad_values_name_the_field_and_what_is_allowed(
    tmp_path: Path, edit, field: str, allowed: str
) -> None:
    path = _write_sweep(tmp_path, edit)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert f"{path}: {field}: " in message
    assert allowed in message


def test_unknown_nested_key_lists_the_section_fields(tmp_path: Path) -> None:
    path = _write_sweep(tmp_path, lambda r: r["teacher"].update(vllm={"tp": 2}))
    with pytest.raises(
        SpecError, match=r"teacher\.vllm\.tp: unknown key \(allowed: batch_invariant, dtype, gpu_mem"
    ):
        load_spec(path)


def test_overrides_apply_last_and_are_validated() -> None:
    smoke = REPO / "sweeps" / "smoke.yaml"
    spec = load_spec(smoke, ["eval.gamma=5", "teacher.temperatures=[0.3, 0.1]", "tracking.experiment=exp"])
    assert spec.eval.gamma == [5]  # one γ or a list: always a list
    assert spec.teacher.temperatures == [0.1, 0.3]  # sorted
    assert spec.experiment == "exp"
    with pytest.raises(
        SpecError, match=r"eval\.gamma\.0: Input should be greater than or equal to 1 \(got 0\)"
    ):
        load_spec(smoke, ["eval.gamma=0"])
    with pytest.raises(SpecError, match="expected KEY=VALUE"):
        load_spec(smoke, ["eval.gamma"])


def test_include_merges_and_sibling_keys_override(tmp_path: Path) -> None:
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "data.yaml").write_text(
        "train: {kind: synthetic, size: 50}\nout_of_domain: {kind: synthetic, families: [word_problem]}\n"
        "train_size: 10\nvalidation_size: 5\nin_domain_test_size: 5\nout_of_domain_test_size: 5\n"
    )
    raw = load_raw(REPO / "sweeps" / "smoke.yaml")
    raw["data"] = {"include": "parts/data.yaml", "train_size": 20}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    spec = load_spec(path)
    assert spec.data.train_size == 20 and spec.data.validation_size == 5 and spec.data.train.size == 50


def test_include_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text("name: x\nmodels: {include: nowhere.yaml}\n")
    with pytest.raises(SpecError, match="include 'nowhere.yaml' not found"):
        load_spec(path)
    (tmp_path / "loop.yaml").write_text("include: loop.yaml\n")
    path.write_text("name: x\nmodels: {include: loop.yaml}\n")
    with pytest.raises(SpecError, match="include cycle"):
        load_spec(path)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"name: [unclosed\n", "malformed YAML"),
        (b"- a\n- b\n", "must be a YAML mapping"),
        (b"name: \xff\xfe\n", "not UTF-8"),
    ],
)
def test_unreadable_files_are_clear_errors(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(SpecError, match=expected):
        load_spec(path)
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "missing.yaml")


def test_specs_are_frozen() -> None:
    spec = load_spec(REPO / "sweeps" / "smoke.yaml")
    with pytest.raises(Exception, match="frozen"):
        spec.eval.gamma = 7  # type: ignore[misc]


def test_the_distillspec_sweeps_are_five_algorithms_by_four_divergences_at_tau_kd_1() -> None:
    for name in ("distillspec_tiny", "distillspec_paper"):
        spec = load_spec(REPO / "sweeps" / f"{name}.yaml")
        assert spec.teacher.temperatures == [1.0] and spec.distill.paradigms == ["online"]
        assert spec.distill.divergences == ["fkl", "rkl", "jsd", "tvd"]
        assert spec.distill.data_source_list == ["supervised_kd", "seqkd", "imitkd", "f_distill", "gkd"]
        assert spec.eval.gamma == [3, 5, 7] and spec.eval.temperatures == [0.0, 1.0]
        assert spec.eval.quality_ends and "empirical" in spec.eval.estimators
