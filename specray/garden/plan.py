"""What a garden run distils and measures, and the checks that refuse a garden before any work.

The garden's models are `models.garden`, smallest first; the last is the teacher and the spec's target.
Each smaller target is distilled from the teacher (online KD at the spec's τ_kd, divergence and data
source); a draft (`models.draft`) is distilled from every raw target and every distilled one. Each of
these is an ordinary pair of the pipeline (`pair_spec`: teacher as `models.target`, student as
`models.draft`), so it goes through the same shards, Train runs and draft keys as a sweep's drafts; a
distilled model's folder name carries its draft key, so whatever is distilled from it, or measured with
it, is keyed by it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specray.config import ModelRef, SweepSpec
from specray.errors import ModelError, SpecError
from specray.models.loading import load_tokenizer
from specray.models.sources import resolve_model_path
from specray.models.zoo import llama_config, shape_of

GARDEN_DIR = "garden"
FIELD = "models.garden"


@dataclass(frozen=True)
class GardenModel:
    """A garden entry: its label in the plot (the zoo entry's name, else the folder or hub name)."""

    label: str
    ref: ModelRef


def garden_models(spec: SweepSpec) -> list[GardenModel]:
    return [GardenModel(model_label(ref), ref) for ref in spec.models.garden]


def model_label(ref: ModelRef) -> str:
    if ref.zoo is not None:
        return ref.zoo
    if ref.gguf is not None:
        return Path(ref.gguf).stem
    if ref.cut is not None:
        return f"cut{ref.cut.layers}"
    if ref.fresh is not None:
        return f"fresh{ref.fresh.num_layers}x{ref.fresh.hidden_size}"
    assert ref.name_or_path is not None  # ModelRef's validator: exactly one source
    return Path(ref.name_or_path.rstrip("/")).name


def require_sweep(spec: SweepSpec, command: str) -> None:
    """Refuse a garden where only a sweep makes sense: a garden runs whole, as `specray garden`, and has no
    τ_kd × τ_dec grid to tune or serve."""
    if spec.models.garden:
        raise SpecError(
            f"{command}: {spec.name} is a model garden ({FIELD} is set); run it whole with "
            "`specray garden`, or leave models.garden out to use it as a sweep"
        )


def require_garden(spec: SweepSpec) -> None:
    """Refuse a sweep where `specray garden` wants a garden."""
    if not spec.models.garden:
        raise SpecError(
            f"specray garden: {spec.name} has no {FIELD} (the targets, smallest first, the last the "
            "teacher); run a sweep with `specray run`"
        )


def kd_mixture(spec: SweepSpec) -> dict[float, float]:
    """The garden distils at the spec's one τ_kd (`check_garden` refuses more)."""
    return {spec.teacher.temperatures[0]: 1.0}


def pair_spec(spec: SweepSpec, teacher: ModelRef, student: ModelRef) -> SweepSpec:
    """The spec under which `student` is distilled from `teacher` online: the pipeline's own pair."""
    models = spec.models.model_copy(update={"target": teacher, "draft": student, "garden": []})
    distill = spec.distill.model_copy(update={"paradigms": ["online"]})
    return spec.model_copy(update={"models": models, "distill": distill})


def distilled_ref(student: ModelRef, output_dir: Path) -> ModelRef:
    """A model distilled into `output_dir` as a model of its own (in the student's dtype)."""
    return ModelRef(name_or_path=str(output_dir), dtype=student.dtype)


def check_garden(spec: SweepSpec) -> None:
    """Refuse, before any work, a garden that cannot be run: several τ_kd, divergences or data sources
    (a garden distils one way), two models of one label, models that do not share the draft's tokenizer,
    or models that do not grow in size from first to last. Zoo entries share the zoo's tokenizer; their
    sizes come from their shapes, so nothing is built to check them."""
    if not spec.models.garden:
        return
    if len(spec.teacher.temperatures) != 1:
        raise SpecError(
            f"{FIELD}: a garden distils at one τ_kd; teacher.temperatures has {spec.teacher.temperatures}"
        )
    if spec.distill.varies_divergence or spec.distill.varies_data_source:
        raise SpecError(
            f"{FIELD}: a garden distils with one divergence and one data source; "
            "give distill.divergence and distill.data_sources one value each"
        )
    _check_tokenizers(spec, [*spec.models.garden, spec.models.draft])
    _check_labels(spec)
    sizes = [parameter_count(spec, ref) for ref in spec.models.garden]
    if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
        listed = ", ".join(
            f"{model_label(r)} {n / 1e6:.2f}M" for r, n in zip(spec.models.garden, sizes, strict=True)
        )
        raise SpecError(
            f"{FIELD}: the models must grow in size from first to last (the last is the teacher); "
            f"parameters: {listed}"
        )


def _check_labels(spec: SweepSpec) -> None:
    """Every model is named by its label in the plot, its folders and its MLflow runs: one label, one model
    (two folders both called `hf`, or a draft named like a target, would overwrite each other)."""
    garden = [model_label(ref) for ref in spec.models.garden]
    labels = [*garden, *(f"{label}-distilled" for label in garden[:-1]), model_label(spec.models.draft)]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise SpecError(
            f"{FIELD}: {', '.join(repeated)} names more than one model (a model's label is its zoo entry "
            "or the last part of its name or path); give each model of the garden and models.draft its own"
        )


def _check_tokenizers(spec: SweepSpec, refs: list[ModelRef]) -> None:
    """One vocabulary for all: zoo entries share the zoo's, a draft made from the target (cut, fresh) the
    target's; other models (a GGUF file dequantised first) are compared."""
    refs = [r for r in refs if r.cut is None and r.fresh is None]  # made from the target: its tokenizer
    others = [r for r in refs if r.zoo is None]
    if others and len(others) != len(refs):
        raise ModelError(
            f"{FIELD}: zoo entries and other models cannot share a tokenizer; give the garden and "
            "models.draft all from the zoo or all otherwise (name or path, GGUF, cut or fresh)"
        )
    if not others:
        return
    paths = [resolve_model_path(ref, spec.models) for ref in others]
    vocabulary = load_tokenizer(paths[0], others[0].trust_remote_code).get_vocab()
    for ref, path in zip(others[1:], paths[1:], strict=True):
        other = load_tokenizer(path, ref.trust_remote_code).get_vocab()
        if other != vocabulary:
            raise ModelError(
                f"{FIELD}: {path} and {paths[0]} have different vocabularies ({len(other)} vs "
                f"{len(vocabulary)} tokens); a garden's models and models.draft need one shared tokenizer"
            )


def parameter_count(spec: SweepSpec, ref: ModelRef) -> int:
    """A model's parameters from its configuration alone (initialised on the meta device: no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config: Any
    if ref.zoo is not None:
        zoo = spec.models.zoo
        config = llama_config(shape_of(zoo, ref.zoo), zoo.vocab_size, zoo.seq_len)
    else:
        path = resolve_model_path(ref, spec.models)
        try:
            config = AutoConfig.from_pretrained(path, trust_remote_code=ref.trust_remote_code)
        except (OSError, ValueError) as e:
            raise ModelError(f"{FIELD}: {path}: cannot read its configuration ({e})") from None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=ref.trust_remote_code)
    return sum(p.numel() for p in model.parameters())
