"""One draft, as one record: planned once (`plan_draft`, called by the sweep's plan, the tune search and the
model garden) with its name, recipe, folder, key and resolved spec, then handed unchanged to the Train
worker, the evaluator, the report, MLflow and the export. Nobody downstream derives a draft's key, folder
or spec again.

Import-light (no torch, no Ray, no MLflow).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from specray.errors import SpecError
from specray.keys.format import FORMAT, FORMAT_VERSION, OlderFormat

if TYPE_CHECKING:
    from specray.config import SweepSpec
    from specray.data.shards import ShardKey

PARADIGMS = ("offline", "online")
T = TypeVar("T")

__all__ = [
    "PARADIGMS",
    "Draft",
    "control_name",
    "draft_folder_name",
    "draft_name",
    "mixture_tag",
    "one_draft",
    "plan_control",
    "plan_draft",
    "replicate_name",
    "representative",
    "split_replicate",
    "variant_name",
]


def draft_name(paradigm: str, mixture: Mapping[float, float]) -> str:
    """`offline/tau_kd=0.6` for a single τ_kd, `online/mix=0.7:1,0.8:1,0.9:1` for a mixture."""
    if len(mixture) == 1:
        return f"{paradigm}/tau_kd={float(next(iter(mixture))):g}"
    return f"{paradigm}/mix=" + mixture_tag(mixture)


def control_name(paradigm: str, tau: float, weights: Sequence[float]) -> str:
    """`offline/tau_kd=0.8/samples=1,1,1`: a control (`plan_control`) of a mixture whose weights are
    `weights`, reading as many teacher samples at the one τ_kd `tau`."""
    return f"{paradigm}/tau_kd={float(tau):g}/samples=" + ",".join(f"{w:g}" for w in weights)


def variant_name(name: str, divergence: str = "", data_source: str = "") -> str:
    """An online draft of DistillSpec's grid: `online/tau_kd=1/tvd/gkd`, with only the axes its sweep varies
    ("" = not varied), so a sweep of one divergence and one data source keeps `online/tau_kd=1`."""
    return "/".join([name, *(axis for axis in (divergence, data_source) if axis)])


def replicate_name(name: str, replicate: int) -> str:
    """Training replicate r of the draft `name`: `online/tau_kd=0.6/r1`; replicate 0 is `name` itself (a
    run without replicates made it, under the same key)."""
    return f"{name}/r{replicate}" if replicate else name


def split_replicate(name: str) -> tuple[str, int]:
    """`online/tau_kd=0.6/r1` -> (`online/tau_kd=0.6`, 1); a name without `/r<k>` is replicate 0 of itself."""
    match = _REPLICATE.match(name)
    return (match.group(1), int(match.group(2))) if match else (name, 0)


_REPLICATE = re.compile(r"^(.+)/r(\d+)$")


def representative(figures: Mapping[T, float]) -> T:
    """Of a recipe's replicates (each with its own figure), the one served or registered for the recipe: the
    one whose figure is closest to the recipe's mean over replicates (ties: the first given).

    The recipe is chosen on that mean (a lucky replicate does not make its recipe win); then the closest
    replicate stands for it, so what is served performs like the mean that chose it, not like the best
    draw (the winner's curse of taking the best replicate)."""
    if not figures:
        raise ValueError("a recipe needs at least one replicate")
    mean = sum(figures.values()) / len(figures)
    return min(figures, key=lambda replicate: abs(figures[replicate] - mean))


def draft_folder_name(name: str) -> str:
    """The folder a draft named `name` is published in (`offline/tau_kd=0.6` -> `offline__tau_kd=0.6`)."""
    return name.replace("/", "__")


def mixture_tag(mixture: Mapping[float, float]) -> str:
    """`0.7:1,0.8:1`: a mixture as MLflow tags and the report print it (τ_kd sorted, as given weights)."""
    return ",".join(f"{float(t):g}:{w:g}" for t, w in sorted(mixture.items()))


@dataclass(frozen=True)
class Draft:
    """A draft of a sweep (or of a tune search, or a model garden's distilled model).

    `spec` is the spec it trains under, resolved once: its paradigm's steps, its replicate's seeds, its
    divergence and data source, and (a garden's pairs) its own teacher and student; `shards` are the
    teacher shards it trains on. `key` and `key_inputs`
    are its draft key and what it was computed from (`specray.keys.draft_key_inputs`); the un-distilled
    baseline has `paradigm` None, an empty mixture and the student as its folder. Two records are the same
    draft when name, folder and key agree.
    """

    name: str  # offline/tau_kd=0.6, online/mix=0.7:1,0.8:1, online/tau_kd=1/tvd/gkd/r1, non-distill
    paradigm: str | None  # None for the un-distilled baseline
    mixture: Mapping[float, float] = field(compare=False)  # {τ_kd: weight}; {} for the baseline
    folder: Path = Path()
    key: str = ""
    key_inputs: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    spec: SweepSpec | None = field(default=None, compare=False, repr=False)
    replicate: int = 0  # training replicate (distill.replicates); 0 for the baseline
    # online drafts of DistillSpec's grid: the divergence and data source (`source_name`) they train
    # with; "" for offline drafts (SeqKD on the shards) and the baseline
    divergence: str = ""
    data_source: str = ""
    # the teacher shards it trains on, by τ_kd of its mixture (their digests are in `key_inputs`)
    shards: Mapping[float, ShardKey] = field(default_factory=dict, compare=False, repr=False)
    # a control (`plan_control`): its weight per teacher sample of its one τ_kd, and those samples' shards,
    # by sample index (sample 0 is `shards`' own); {} for every other draft
    samples: Mapping[int, float] = field(default_factory=dict, compare=False)
    sample_shards: Mapping[int, ShardKey] = field(default_factory=dict, compare=False, repr=False)

    @property
    def trained(self) -> bool:
        """False for the un-distilled baseline, which is evaluated but never trained."""
        return self.paradigm is not None

    @property
    def recipe(self) -> str:
        """The draft's name without its replicate: what the report averages replicates over."""
        return self.name.removesuffix(f"/r{self.replicate}") if self.replicate else self.name

    @property
    def tau_kd(self) -> float | None:
        """The single τ_kd of a one-temperature recipe (None for mixtures and the baseline)."""
        return next(iter(self.mixture)) if len(self.mixture) == 1 else None

    @property
    def components(self) -> dict[float, float]:
        """What its training rows are drawn from, with their weights: the mixture's τ_kd, or a control's
        sample indices (as floats: the training data keys its rows by component)."""
        if self.samples:
            return {float(j): float(w) for j, w in sorted(self.samples.items())}
        return dict(self.mixture)

    @property
    def train_spec(self) -> SweepSpec:
        """The spec this draft trains under (a baseline has none: it is not trained)."""
        if self.spec is None:
            raise ValueError(f"{self.name}: a draft record without its spec cannot be trained")
        return self.spec

    @property
    def tags(self) -> dict[str, str]:
        """MLflow tags the UI can filter on."""
        tau_kd = "" if self.tau_kd is None else f"{self.tau_kd:g}"
        tags = {"paradigm": self.paradigm or "none", "tau_kd": tau_kd, "mixture": mixture_tag(self.mixture)}
        tags |= {"divergence": self.divergence, "data_source": self.data_source}
        if self.samples:
            tags["samples"] = ",".join(f"{w:g}" for _, w in sorted(self.samples.items()))
        return tags | {"replicate": str(self.replicate)}

    def to_json(self) -> dict[str, Any]:
        """The record as plain data (without its spec, which its folder's spec.yaml and the sweep's hold)."""
        return {
            "name": self.name,
            "paradigm": self.paradigm,
            "mixture": {f"{float(t):g}": float(w) for t, w in sorted(self.mixture.items())},
            "folder": str(self.folder),
            "key": self.key,
            "replicate": self.replicate,
            "divergence": self.divergence,
            "data_source": self.data_source,
            "recipe": self.recipe,
            "samples": {str(j): w for j, w in sorted(self.samples.items())},
            FORMAT: FORMAT_VERSION,
        }

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> Draft:
        """A record written by `to_json` (its spec is not restored: such a record is for reading results);
        `keys.OlderFormat` for a record of another format."""
        if payload.get(FORMAT) != FORMAT_VERSION:
            raise OlderFormat(f"draft record of format {payload.get(FORMAT, '(none)')}, not {FORMAT_VERSION}")
        return cls(
            name=payload["name"],
            paradigm=payload["paradigm"],
            mixture={float(t): float(w) for t, w in payload["mixture"].items()},
            folder=Path(payload["folder"]),
            key=payload["key"],
            replicate=int(payload["replicate"]),
            divergence=payload["divergence"],
            data_source=payload["data_source"],
            samples={int(j): float(w) for j, w in payload["samples"].items()},
        )


def _check_request(spec: SweepSpec, paradigm: str, mixture: Mapping[float, float]) -> dict[float, float]:
    """The mixture as {τ_kd: weight}; SpecError naming the bad value before any work starts.

    The one validation of a draft's request: `plan_draft` and `plan_control` make a `Draft` only from a
    request that passes it, and everything downstream (the stages, the Train driver, its workers, the loop)
    receives that record and does not check it again."""
    if paradigm not in PARADIGMS:
        raise SpecError(f"paradigm {paradigm!r} is not one of {', '.join(PARADIGMS)}")
    weights = {float(tau): float(weight) for tau, weight in mixture.items()}
    if not weights or any(not weight > 0 for weight in weights.values()):
        raise SpecError(f"a mixture needs at least one τ_kd and weights > 0, got {weights}")
    unknown = sorted(set(weights) - set(spec.teacher.temperatures))
    if unknown:
        raise SpecError(
            f"τ_kd {unknown} not in teacher.temperatures {spec.teacher.temperatures} "
            "(distillation trains on those shards only)"
        )
    d = spec.distill
    if d.batch_size < d.workers:
        raise SpecError(
            f"distill.batch_size ({d.batch_size}) must be >= distill.workers ({d.workers}): "
            "each worker trains on its slice of every batch"
        )
    return weights


def plan_draft(
    spec: SweepSpec,
    shard_keys: Mapping[float, ShardKey],
    paradigm: str,
    mixture: Mapping[float, float],
    replicate: int = 0,
    divergence: str = "",
    data_source: str = "",
    *,
    root: Path | None = None,
    name: str | None = None,
    folder: Path | Callable[[str], Path] | None = None,
) -> Draft:
    """One distilled draft of `spec` trained on the teacher shards `shard_keys` (by τ_kd): the spec it
    trains under (its paradigm's steps, its replicate's seeds, its divergence and data source), its key,
    its name (only the axes the sweep varies enter it) and its folder (`root/<name>` unless `folder` is
    given, or a function of the key)."""
    from specray.keys import digest, draft_key_inputs

    weights = _check_request(spec, paradigm, mixture)
    d = spec.distill
    varied = (divergence if d.varies_divergence else "", data_source if d.varies_data_source else "")
    name = name or replicate_name(variant_name(draft_name(paradigm, mixture), *varied), replicate)
    own = spec.for_draft(paradigm, replicate, divergence, data_source)
    keys = {tau: shard_keys[tau] for tau in weights if tau in shard_keys}
    inputs = draft_key_inputs(own, paradigm, weights, {tau: key.digest for tau, key in keys.items()})
    key = digest(inputs)
    where = folder(key) if callable(folder) else folder or (root or Path()) / draft_folder_name(name)
    return Draft(name, paradigm, weights, where, key, inputs, own, replicate, divergence, data_source, keys)


def one_draft(spec: SweepSpec, paradigm: str, mixture: Mapping[float, float], folder: Path) -> Draft:
    """A draft planned on its own (`specray distill`, a benchmark, a test): `plan_draft` on the shards of
    the spec's train split."""
    from specray.keys import train_shard_keys

    return plan_draft(spec, train_shard_keys(spec), paradigm, mixture, folder=folder)


def plan_control(
    spec: SweepSpec,
    samples: Sequence[ShardKey],
    weights: Sequence[float],
    paradigm: str,
    replicate: int = 0,
    *,
    name: str | None = None,
    folder: Path | Callable[[str], Path],
) -> Draft:
    """The control of a mixture of k τ_kd with `weights`: k teacher samples of the train prompts at one τ_kd
    (`samples`: their shards, sample 0 the sweep's own shard at that τ_kd), drawn by the mixture's weights.
    It reads as many distinct teacher responses per prompt as the mixture, at one temperature, and trains
    with the mixture's steps, seeds and replicate: what a mixture gains over it is the temperatures', not
    the extra samples'."""
    from specray.keys import digest, draft_key_inputs

    taus = {key.tau for key in samples}
    if len(taus) != 1 or len(set(samples)) != len(samples) or len(samples) != len(weights) or not samples:
        raise ValueError(f"a control needs distinct shards of one τ_kd, one per weight: {samples}, {weights}")
    tau = taus.pop()
    _check_request(spec, paradigm, {tau: 1.0})
    if any(not w > 0 for w in weights):
        raise SpecError(f"a control's weights must be > 0, got {list(weights)}")
    name = name or replicate_name(control_name(paradigm, tau, weights), replicate)
    own = spec.for_draft(paradigm, replicate)
    drawn = [(float(w), key.digest) for w, key in zip(weights, samples, strict=True)]
    inputs = draft_key_inputs(own, paradigm, {tau: 1.0}, {tau: samples[0].digest}, drawn)
    key = digest(inputs)
    where = folder(key) if callable(folder) else folder
    return Draft(
        name,
        paradigm,
        {tau: 1.0},
        where,
        key,
        inputs,
        own,
        replicate,
        shards={tau: samples[0]},
        samples=dict(enumerate(float(w) for w in weights)),
        sample_shards=dict(enumerate(samples)),
    )
