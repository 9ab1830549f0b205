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

GARDEN_DIR = "garden"


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
    assert ref.name_or_path is not None  # ModelRef's validator: exactly one of the two
    return Path(ref.name_or_path.rstrip("/")).name


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
    (a garden distils one way), models that do not share the draft's tokenizer, or models that do not
    grow in size from first to last. Zoo entries share the zoo's tokenizer; their sizes come from their
    shapes, so nothing is built to check them."""
    if not spec.models.garden:
        return
    field = "models.garden"
    if len(spec.teacher.temperatures) != 1:
        raise SpecError(
            f"{field}: a garden distils at one τ_kd; teacher.temperatures has {spec.teacher.temperatures}"
        )
    if spec.distill.varies_divergence or spec.distill.varies_data_source:
        raise SpecError(
            f"{field}: a garden distils with one divergence and one data source; "
            "give distill.divergence and distill.data_sources one value each"
        )
    refs = [*spec.models.garden, spec.models.draft]
    paths = [r for r in refs if r.name_or_path is not None]
    if paths and len(paths) != len(refs):
        raise ModelError(
            f"{field}: zoo entries and models by name or path cannot share a tokenizer; give the garden and "
            "models.draft all from the zoo or all by name or path"
        )
    if paths:
        from specray.models.loading import load_tokenizer

        first = str(paths[0].name_or_path)
        vocabulary = load_tokenizer(first, paths[0].trust_remote_code).get_vocab()
        for ref in paths[1:]:
            other = load_tokenizer(str(ref.name_or_path), ref.trust_remote_code).get_vocab()
            if other != vocabulary:
                raise ModelError(
                    f"{field}: {ref.name_or_path} and {first} have different vocabularies ({len(other)} vs "
                    f"{len(vocabulary)} tokens); a garden's models and models.draft need one shared tokenizer"
                )
    sizes = [parameter_count(spec, ref) for ref in spec.models.garden]
    if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
        listed = ", ".join(
            f"{model_label(r)} {n / 1e6:.2f}M" for r, n in zip(spec.models.garden, sizes, strict=True)
        )
        raise SpecError(
            f"{field}: the models must grow in size from first to last (the last is the teacher); "
            f"parameters: {listed}"
        )


def parameter_count(spec: SweepSpec, ref: ModelRef) -> int:
    """A model's parameters from its configuration alone (initialised on the meta device: no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config: Any
    if ref.zoo is not None:
        from specray.models.zoo import llama_config, shape_of

        zoo = spec.models.zoo
        config = llama_config(shape_of(zoo, ref.zoo), zoo.vocab_size, zoo.seq_len)
    else:
        config = AutoConfig.from_pretrained(str(ref.name_or_path), trust_remote_code=ref.trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=ref.trust_remote_code)
    return sum(p.numel() for p in model.parameters())
