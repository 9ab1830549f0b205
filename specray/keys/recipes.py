"""The key recipes of a sweep's results: what a draft's weights, its curves, the step costs, an evaluation
cell and a garden point each depend on, as flat dicts of inputs named like the spec (`fields.FIELDS`), and
the sweep's own key. Every input is in its key unconditionally: a key is read off its inputs, with no value
left out because it is a default."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from specray.data.splits import fingerprint
from specray.devices import device_kind, train_device_kind
from specray.keys.fields import classification, direct_inputs, field_value, leaf_fields
from specray.keys.format import digest
from specray.models.sources import model_id

if TYPE_CHECKING:
    from specray.config import SweepSpec
    from specray.data.examples import Example


def canonical_mixture(mixture: Mapping[float, float]) -> str:
    """`0.7:0.333333,0.9:0.666667`: normalised weights, so `{0.7: 1, 0.9: 2}` and `{0.7: 2, 0.9: 4}` agree."""
    total = sum(mixture.values())
    return ",".join(f"{float(t):g}:{w / total:.6g}" for t, w in sorted(mixture.items()))


def draft_key_inputs(
    spec: SweepSpec,
    paradigm: str | None,
    mixture: Mapping[float, float],
    shard_digests: Mapping[float, str],
    samples: Sequence[tuple[float, str]] = (),
) -> dict[str, Any]:
    """What a draft's weights depend on. `paradigm` None is the un-distilled draft (the student itself).
    `samples`: a control's (weight, shard digest) per teacher sample of its one τ_kd (`draft.plan_control`);
    only a control's inputs have them."""
    inputs: dict[str, Any] = {"student": model_id(spec.models.draft, spec.models)}
    if paradigm is None:
        return inputs
    if paradigm == "online" and (spec.distill.varies_divergence or spec.distill.varies_data_source):
        raise ValueError("an online draft's key needs one divergence and data source (SweepSpec.for_variant)")
    roles = ("draft", "draft:online") if paradigm == "online" else ("draft",)
    inputs |= direct_inputs(spec.for_paradigm(paradigm), *roles)
    inputs.pop("distill.online_steps", None)  # resolved into distill.steps: the steps this draft trains
    if paradigm == "online":
        inputs["target"] = model_id(spec.models.target, spec.models)
        if spec.distill.draft_divergence != "jsd":
            inputs.pop("distill.jsd_beta")
    inputs |= {
        "paradigm": paradigm,
        "mixture": canonical_mixture(mixture),
        "shards": {f"{float(t):g}": shard_digests[t] for t in sorted(mixture)},
        "device": train_device_kind(spec.distill.num_gpus_per_worker, spec.distill.cpu_autocast),
    }
    if samples:
        total = sum(weight for weight, _ in samples)
        inputs["samples"] = [[f"{weight / total:.6g}", shard] for weight, shard in samples]
    return inputs


def curve_inputs(spec: SweepSpec) -> dict[str, Any]:
    """What the acceptance-vs-KD-step curves recorded with a draft depend on beyond its weights."""
    return direct_inputs(spec, "curves")


def cost_ratio_inputs(spec: SweepSpec) -> dict[str, Any]:
    """What the measured step costs depend on: the pair's architectures, dtype, device and threads, and
    which γ and B are timed."""
    return direct_inputs(spec, "cost_ratio") | {
        "target": model_id(spec.models.target, spec.models),
        "student": model_id(spec.models.draft, spec.models),
        "models.target.dtype": spec.models.target.dtype,
        "device": device_kind(spec.eval.num_gpus),
        "threads": max(1, int(spec.eval.num_cpus)),
    }


def cell_key_inputs(
    spec: SweepSpec,
    draft_key: str,
    prompts_fingerprint: str,
    test_set: str,
    tau_dec: float,
    estimator: str,
    gamma: int,
    step_costs: str | None,
    lenience: tuple[str | None, float] = (None, 1.0),
    batch_size: int = 1,
) -> dict[str, Any]:
    """What one evaluation cell's record depends on (`step_costs`: a digest of the costs' values,
    analytic cells only; `lenience`: the cell's (function, ε), None when lossless; `batch_size`: the rows
    an empirical cell decodes together)."""
    inputs = direct_inputs(spec, "cell", f"cell:{estimator}")
    inputs |= {
        "draft": draft_key,
        "target": model_id(spec.models.target, spec.models),
        "device": device_kind(spec.eval.num_gpus),
        "prompts": prompts_fingerprint,
        "test_set": test_set,
        "tau_dec": float(tau_dec),
        "estimator": estimator,
        "eval.gamma": int(gamma),
        "eval.lenience.function": lenience[0],
        "eval.lenience.epsilon": float(lenience[1]),
        "batch_size": int(batch_size),
    }
    if estimator == "analytic":
        inputs["step_costs"] = step_costs
    else:
        inputs["threads"] = max(1, int(spec.eval.num_cpus))
    return inputs


def garden_point_key(
    spec: SweepSpec, decodes: Mapping[str, Any], prompts_fingerprint: str, measure_format: int
) -> str:
    """A model garden's point: what it decodes (`decodes`: the kind of point, τ, γ, lenience, and the
    models by what they are), on which prompts, how long, how often, with which seeds, on what (device and
    threads: the latencies), measured by which version of the measurement (`measure_format`)."""
    e = spec.eval
    return digest(
        {
            "garden_point": measure_format,
            "decodes": dict(decodes),
            "prompts": prompts_fingerprint,
            "max_new_tokens": e.max_new_tokens,
            "repeats": e.repeats,
            "seed": e.seed,
            "device": {"num_cpus": e.num_cpus, "num_gpus": e.num_gpus},
        }
    )


def answers_key(later: Sequence[Example], target: str, max_new_tokens: int, device: str) -> str:
    """The target's earlier answers in multi-turn test prompts (`specdec.turns`): the conversations that
    need them (`later`: their later-turn examples), the target by its model id, the length, the device."""
    inputs = {"conversations": fingerprint(later), "target": target}
    return digest(inputs | {"max_new_tokens": max_new_tokens, "device": device})


def prompt_ids_key(prompts: Sequence[Sequence[int]]) -> str:
    """Prompts by their token ids: the model garden measures on the first test set's encoded prompts."""
    return digest({"prompts": prompts}, 16)


def spec_key(spec: SweepSpec, with_tune: bool = False) -> str:
    """Identity of a sweep's work (MLflow parent runs are tagged with it): every field that changes a result,
    the grid or the report (and the tune search for `specray tune`); not where or how it runs."""
    skipped = {"none"} if with_tune else {"none", "tune"}
    inputs: dict[str, Any] = {}
    for path in leaf_fields():
        entry = classification(path)
        if entry is not None and not entry.roles <= skipped:
            inputs[path] = field_value(spec, path)
    return digest(inputs | {"name": spec.name}, length=16)
