"""The model garden: its spec checks, the zoo's size ladder keys, the points it measures, and the report's
Pareto fronts and latency reduction at matched quality (hand-computed)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from specray.config import ModelRef, SweepSpec, TinyLlamaSpec, ZooSpec, load_spec
from specray.errors import ModelError, SpecError
from specray.garden.plan import check_garden, kd_mixture, pair_spec, parameter_count
from specray.models.sources import model_id
from specray.models.zoo import model_key, shape_of, zoo_key, zoo_models
from specray.report.garden import figures, garden_section, matched_reduction, pareto_front, reductions
from specray.specdec.garden_points import GardenPoint, PointResult, measure_point
from specray.specdec.records import EvalSettings
from tests.conftest import REPO

FAST_ZOO_KEY = "2e043e2f42359430"  # sweeps/smoke.yaml's zoo (zoo format 3, its whole spec)
SETTINGS = EvalSettings(repeats=2, max_new_tokens=12, empirical_prompts=3, seed=0)

SMOKE = load_spec(REPO / "sweeps" / "smoke.yaml")
SMALL = TinyLlamaSpec(
    hidden_size=48, num_layers=1, num_heads=2, intermediate_size=128, train_steps=4, lr=3e-3
)
BIG = TinyLlamaSpec(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=256, train_steps=4, lr=3e-3)


def garden_spec(ladder: dict[str, TinyLlamaSpec], garden: list[dict], **changes) -> SweepSpec:
    raw = SMOKE.model_dump(mode="json")
    raw["models"]["zoo"]["ladder"] = {name: shape.model_dump() for name, shape in ladder.items()}
    raw["models"]["garden"] = garden
    raw["teacher"]["temperatures"] = [1.0]
    for path, value in changes.items():
        node = raw
        *parents, last = path.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return SweepSpec.model_validate(raw)


def test_a_garden_of_zoo_sizes_validates_and_pairs_its_models() -> None:
    spec = garden_spec({"small": SMALL}, [{"zoo": "small"}, {"zoo": "target"}])
    check_garden(spec)
    assert zoo_models(spec.models.zoo) == ("target", "draft", "small")
    assert kd_mixture(spec) == {1.0: 1.0}
    pair = pair_spec(spec, spec.models.target, spec.models.garden[0])
    assert pair.models.draft.zoo == "small" and pair.models.target.zoo == "target"
    assert pair.distill.paradigms == ["online"] and pair.models.garden == []
    sizes = [parameter_count(spec, ref) for ref in spec.models.garden]
    assert sizes[0] < sizes[1]


@pytest.mark.parametrize(
    ("ladder", "garden", "message"),
    [
        ({"small": SMALL}, [{"zoo": "tiny"}, {"zoo": "target"}], "'tiny' is not a model of the zoo; allowed"),
        ({"small": SMALL}, [{"zoo": "small"}], "at least two"),
        ({"small": SMALL}, [{"zoo": "target"}, {"zoo": "small"}], "must be the same as `target`"),
        ({"small": SMALL}, [{"zoo": "small"}, {"zoo": "small"}, {"zoo": "target"}], "listed twice"),
        ({"draft": SMALL}, [{"zoo": "draft"}, {"zoo": "target"}], "other than target or draft"),
    ],
)
def test_a_malformed_garden_is_refused_naming_the_field(ladder, garden, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        garden_spec(ladder, garden)


def test_a_garden_that_does_not_grow_in_size_is_refused_listing_the_sizes() -> None:
    spec = garden_spec({"big": BIG}, [{"zoo": "big"}, {"zoo": "target"}])
    with pytest.raises(SpecError, match=r"models.garden: the models must grow in size.*big 0\.\d+M, target"):
        check_garden(spec)


def test_a_garden_distils_one_way() -> None:
    several = garden_spec(
        {"small": SMALL}, [{"zoo": "small"}, {"zoo": "target"}], teacher__temperatures=[0.5, 1]
    )
    with pytest.raises(SpecError, match="one τ_kd"):
        check_garden(several)
    grid = garden_spec(
        {"small": SMALL}, [{"zoo": "small"}, {"zoo": "target"}], distill__divergence=["fkl", "tvd"]
    )
    with pytest.raises(SpecError, match="one divergence"):
        check_garden(grid)


def test_garden_models_by_path_must_share_a_tokenizer(tmp_path: Path, micro_zoo) -> None:
    from specray.models.zoo import train_tokenizer

    other = tmp_path / "other"
    train_tokenizer(["a b c d e f g"] * 20, 300).save_pretrained(other)
    target, draft = str(micro_zoo.target), str(micro_zoo.draft)
    spec = garden_spec(
        {},
        [{"name_or_path": str(other)}, {"name_or_path": target}],
        models__target={"name_or_path": target},
        models__draft={"name_or_path": draft},
    )
    with pytest.raises(ModelError, match="different vocabularies"):
        check_garden(spec)
    mixed = garden_spec(
        {"small": SMALL}, [{"zoo": "small"}, {"zoo": "target"}], models__draft={"name_or_path": draft}
    )
    with pytest.raises(ModelError, match="cannot share a tokenizer"):
        check_garden(mixed)


def test_a_garden_naming_two_models_alike_or_holding_an_unreadable_one_is_refused(
    tmp_path: Path, micro_zoo
) -> None:
    import shutil

    target, draft = str(micro_zoo.target), str(micro_zoo.draft)
    by_path = {"models__target": {"name_or_path": target}, "models__draft": {"name_or_path": draft}}
    namesake = tmp_path / "copy" / "target"  # a smaller model in a folder named like the teacher's
    shutil.copytree(micro_zoo.draft, namesake)
    twice = garden_spec({}, [{"name_or_path": str(namesake)}, {"name_or_path": target}], **by_path)
    with pytest.raises(SpecError, match="models.garden: target names more than one model"):
        check_garden(twice)
    broken = tmp_path / "small"
    shutil.copytree(micro_zoo.target, broken)
    (broken / "config.json").unlink()
    unreadable = garden_spec({}, [{"name_or_path": str(broken)}, {"name_or_path": target}], **by_path)
    with pytest.raises(ModelError, match=f"models.garden: {broken}: cannot read its configuration"):
        check_garden(unreadable)


def test_the_point_worker_measures_on_its_reserved_device_in_the_models_dtype(micro_zoo) -> None:
    from specray.devices import Resources
    from specray.specdec.workers import PointWorker

    target = str(micro_zoo.target)
    worker = PointWorker(target, [[1, 2, 3]], [], SETTINGS, Resources(1.0), {target: {"dtype": "bfloat16"}})
    assert worker.ready()["device"] == "cpu"
    assert next(worker._model(target).parameters()).dtype == torch.bfloat16
    # a GPU reserved where torch sees none is refused in one line, not measured on the CPU instead
    if not torch.cuda.is_available():
        gpu = PointWorker(target, [[1, 2, 3]], [], SETTINGS, Resources(1.0, 1.0), {})
        with pytest.raises(SpecError, match="GPU.*reserved but torch"):
            gpu.ready()


def test_a_ladder_keeps_the_target_and_draft_keys_and_keys_each_size_on_its_own() -> None:
    plain = SMOKE.models.zoo
    laddered = ZooSpec.model_validate(plain.model_dump() | {"ladder": {"small": SMALL, "big": BIG}})
    assert zoo_key(laddered) != zoo_key(plain)  # a zoo with more models is another zoo...
    for name in ("target", "draft"):  # ...whose target and draft are copied from the plain one, not retrained
        assert model_key(laddered, name) == model_key(plain, name)
    assert model_key(laddered, "small") != model_key(laddered, "big")
    # an entry is keyed (and seeded) by its own name and shape: the other entries do not change it
    only_small = ZooSpec.model_validate(plain.model_dump() | {"ladder": {"small": SMALL}})
    assert model_key(only_small, "small") == model_key(laddered, "small")
    renamed = ZooSpec.model_validate(plain.model_dump() | {"ladder": {"tiny": SMALL, "big": BIG}})
    assert model_key(renamed, "big") == model_key(laddered, "big")
    assert model_key(renamed, "tiny") != model_key(laddered, "small")  # another name, another seed
    assert shape_of(laddered, "big") == BIG
    # an empty ladder is the plain zoo (golden: the fast zoo's key)
    assert (
        zoo_key(ZooSpec.model_validate(plain.model_dump() | {"ladder": {}})) == zoo_key(plain) == FAST_ZOO_KEY
    )


def test_a_ladder_renames_no_other_model() -> None:
    plain = SMOKE.models
    laddered = plain.model_copy(
        update={"zoo": ZooSpec.model_validate(plain.zoo.model_dump() | {"ladder": {"small": SMALL}})}
    )
    bigger = laddered.model_copy(
        update={
            "zoo": ZooSpec.model_validate(plain.zoo.model_dump() | {"ladder": {"small": SMALL, "big": BIG}})
        }
    )
    for ref in (plain.target, plain.draft):  # the garden's teacher keeps the id a plain sweep gives it
        assert model_id(ref, laddered) == model_id(ref, plain) == model_id(ref, bigger)
    small = ModelRef(zoo="small")
    assert (
        model_id(small, laddered)
        == model_id(small, bigger)
        == f"zoo/{model_key(laddered.zoo, 'small')}/small"
    )


def test_a_lossless_greedy_speculative_point_decodes_what_its_target_alone_does(micro_zoo) -> None:
    from specray.config.vocabulary import IN_DOMAIN
    from specray.data.synthetic import synthetic_corpus
    from specray.data.templates import format_prompt
    from specray.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(str(micro_zoo.target))
    target, draft = load_model(str(micro_zoo.target)), load_model(str(micro_zoo.draft))
    examples = synthetic_corpus(3, 5, IN_DOMAIN)
    prompts = [tokenizer(format_prompt(e.instruction, e.input))["input_ids"] for e in examples]
    texts: list[str] = []

    def text(tokens: list[int]) -> str:
        texts.append(tokenizer.decode(tokens, skip_special_tokens=True))
        return texts[-1]

    def point(draft_path: str | None) -> GardenPoint:
        return GardenPoint("raw" if draft_path is None else "speculative", "t", "T", draft_path, 0.0, 3)

    alone = measure_point(point(None), target, None, prompts, examples, text, SETTINGS, None)
    alone_texts = list(texts)
    texts.clear()
    spec = measure_point(point("D"), target, draft, prompts, examples, text, SETTINGS, None)
    assert texts == alone_texts and spec.quality == alone.quality and spec.tokens == alone.tokens
    assert alone.tokens == [24, 24, 24] and alone.steps == [24, 24, 24]  # 2 repeats × 12 tokens, one a step
    # the target as its own draft accepts every proposal: 12 tokens in blocks of γ + 1 = 4, three steps
    itself = measure_point(point("T"), target, target, prompts, examples, text, SETTINGS, None)
    assert itself.steps == [6, 6, 6] and itself.tokens == alone.tokens
    (latency,), _ = figures([alone])
    assert latency == pytest.approx(1e3 * sum(alone.seconds) / 72)
    again = PointResult.from_json(spec.to_json())
    assert again.point == spec.point and again.quality == spec.quality


def result(curve: str, model: str, seconds: list[float], quality: list[float], draft: str | None = None):
    point = GardenPoint(curve, model, f"/{model}", draft, 1.0, 3 if draft else 0)
    return PointResult(point, "exact_match", seconds, [10] * len(seconds), quality)


def test_a_pareto_front_keeps_the_points_nothing_beats_on_both_axes() -> None:
    latency = np.array([1.0, 2.0, 3.0, 2.5, 0.5])
    quality = np.array([0.2, 0.5, 0.9, 0.4, 0.1])
    assert pareto_front(latency, quality) == [4, 0, 1, 2]  # 3 is slower and worse than 1


def test_the_latency_reduction_at_matched_quality_by_hand() -> None:
    # raw: small 1 ms/token q .3, big 4 ms q .8; distillspec: small' 0.5 ms q .4, big' 2 ms q .8
    # small' is matched by big (the cheapest raw at least .4): 4 / 0.5 = 8; big' by big: 4 / 2 = 2 -> 8x
    points = [
        result("raw", "small", [0.01] * 4, [0.3] * 4),
        result("raw", "big", [0.04] * 4, [0.8] * 4),
        result("distillspec", "small'", [0.005] * 4, [0.4] * 4, "d"),
        result("distillspec", "big'", [0.02] * 4, [0.8] * 4, "d"),
        result("distilled", "tiny'", [0.001] * 4, [0.9] * 4),  # better than every raw: unmatched, left out
    ]
    latency = np.array([1.0, 4.0, 0.5, 2.0, 0.1])
    quality = np.array([0.3, 0.8, 0.4, 0.8, 0.9])
    assert matched_reduction(latency, quality, [2, 3], [0, 1]) == (8.0, 2, 1)
    assert matched_reduction(latency, quality, [4], [0, 1]) is None
    found = {r.curve: r for r in reductions(points)}
    assert set(found) == {"distillspec"}
    r = found["distillspec"]
    assert r.factor == pytest.approx(8.0) and r.point == "small' γ=3" and r.raw == "big"
    assert r.low == pytest.approx(8.0) and r.high == pytest.approx(8.0)  # no spread over prompts: no width


def test_the_interval_of_a_reduction_holds_its_estimate_and_widens_with_noise(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    noisy = lambda mean: list(np.clip(rng.normal(mean, 0.15, 24), 0, 1))  # noqa: E731
    points = [
        result("raw", "small", list(rng.uniform(0.008, 0.012, 24)), noisy(0.3)),
        result("raw", "big", list(rng.uniform(0.035, 0.045, 24)), noisy(0.8)),
        result("distillspec", "small'", list(rng.uniform(0.004, 0.006, 24)), noisy(0.5), "d"),
    ]
    (r,) = reductions(points)
    assert r.low <= r.factor <= r.high and r.high - r.low > 0
    assert math.isclose(r.factor, np.sum(points[1].seconds) / np.sum(points[2].seconds))
    section = garden_section(points, tmp_path)
    assert "Latency reduction at matched quality" in section and "distillspec" in section
    assert (tmp_path / "garden_quality_latency.png").stat().st_size > 0


def test_a_garden_draft_carries_its_own_models_and_is_keyed_under_them() -> None:
    import pickle

    from specray.draft import plan_draft
    from specray.keys import train_shard_keys

    spec = garden_spec({"small": SMALL}, [{"zoo": "small"}, {"zoo": "target"}])
    pair = pair_spec(spec, spec.models.target, spec.models.garden[0])
    base = pair_spec(spec, spec.models.target, spec.models.draft)

    def draft(of: SweepSpec):  # noqa: ANN202
        return plan_draft(of, train_shard_keys(of), "online", {1.0: 1.0}, folder=Path("/x"))

    small = draft(pair)
    assert small.train_spec.models == pair.models  # the pair's models ride on the draft, not on the run
    assert draft(base).train_spec.models == base.models and small.key != draft(base).key
    # what a Train worker gets is this record, spec included
    assert pickle.loads(pickle.dumps(small)).train_spec == small.train_spec


def test_each_decoding_temperature_gets_its_own_plot_and_reductions(tmp_path: Path) -> None:
    at_one = [
        result("raw", "small", [0.01] * 4, [0.3] * 4),
        result("raw", "big", [0.04] * 4, [0.8] * 4),
        result("distillspec", "small'", [0.005] * 4, [0.4] * 4, "d"),
    ]
    greedy = [
        PointResult(
            GardenPoint(r.point.curve, r.point.model, r.point.target, r.point.draft, 0.0, r.point.gamma),
            r.metric,
            [s * 2 for s in r.seconds],
            r.tokens,
            r.quality,
        )
        for r in at_one
    ]
    section = garden_section([*greedy, *at_one], tmp_path)
    assert "### τ_dec = 0" in section and "### τ_dec = 1" in section
    for tau in ("0", "1"):
        assert (tmp_path / f"garden_quality_latency_tau_{tau}.png").stat().st_size > 0
    # each τ_dec's reduction uses its own points only: 8x at both (the greedy points are all twice as slow)
    assert section.count("| 8.00 |") == 2


def test_specray_garden_takes_only_a_garden_and_specray_run_only_a_sweep(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from specray.cli import app

    garden, sweep = REPO / "sweeps" / "garden_tiny.yaml", REPO / "sweeps" / "smoke.yaml"
    out = f"output_dir={tmp_path}"
    refused = CliRunner().invoke(app, ["garden", str(sweep), out, "--dry-run"])
    assert refused.exit_code == 2 and "specray garden: smoke has no models.garden" in refused.output
    assert "`specray run`" in refused.output
    refused = CliRunner().invoke(app, ["run", str(garden), out, "--dry-run"])
    assert refused.exit_code == 2, refused.output
    assert "specray run: garden_tiny is a model garden" in refused.output
    assert "`specray garden`" in refused.output
