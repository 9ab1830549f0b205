"""Named training-data recipes of published KD methods (DistillSpec, Zhou et al., 2023, Table 1).

DistillSpec's Algorithm A.2 builds every batch from three sources: a fraction λ1 of *fixed* data (the
dataset's ground-truth outputs), a fraction λ2 of *student* samples (on-policy, drawn from the current
draft), and the rest, 1 − λ1 − λ2, *teacher* samples. In specray the teacher samples are the cached τ_kd
shards and the student samples are drawn at the row's τ_kd. The published methods differ in the
fractions (and in the divergence, which stays the separate `distill.divergence` setting; `divergence`
below only records what each paper used).

`distill.data_sources` names one of these presets, or gives the fractions directly:
`distill.data_sources: {fixed: 0.25, student: 0.5}`. The sources shape the batches of the white-box
*online* paradigm; the *offline* paradigm stays black-box SeqKD (cross-entropy on the τ_kd shards).

Two presets read λ = `distill.onpolicy_fraction` (the TempSpec paper's λ, also what `tune.onpolicy_fractions`
searches): `tempspec` takes λ student samples and (1 − λ) ground truth, the online recipe of Ouyang et al.
(2024); `tempspec_teacher` takes the (1 − λ) half from the τ_kd teacher shards instead, specray's original
online paradigm (the default, so existing drafts keep their results). The second mixes two temperature
effects (the student's and the teacher's sampling temperature are both τ_kd), the first only one.
They are part of the spec (`distill.data_sources` names one), so they live in `specray.config` with the
spec types that hold them: the presets, their names and the explicit fractions are validated together at
the edge, and the train loop reads the resolved fractions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

LAMBDA = "λ"  # a fraction given as λ = distill.onpolicy_fraction
ONE_MINUS_LAMBDA = "1-λ"


@dataclass(frozen=True)
class DataPreset:
    """A recipe's fractions: numbers, or LAMBDA / ONE_MINUS_LAMBDA to follow distill.onpolicy_fraction."""

    fixed: float | str  # λ1: ground-truth outputs of the dataset
    student: float | str  # λ2: on-policy student samples at τ_kd
    source: str  # the paper that used this data
    divergence: str  # the divergence that paper paired with it (not set by the preset)

    def fractions(self, onpolicy_fraction: float) -> tuple[float, float]:
        """(λ1 fixed, λ2 student) with λ = `onpolicy_fraction` substituted."""
        values: dict[float | str, float] = {
            LAMBDA: onpolicy_fraction,
            ONE_MINUS_LAMBDA: 1.0 - onpolicy_fraction,
        }
        return float(values.get(self.fixed, self.fixed)), float(values.get(self.student, self.student))

    @property
    def reads_lambda(self) -> bool:
        return LAMBDA in (self.fixed, self.student)


DATA_PRESETS: dict[str, DataPreset] = {
    # word-level KD on the teacher's sampled sequences (Kim & Rush, "Sequence-Level Knowledge
    # Distillation", EMNLP 2016); DistillSpec's white-box form uses FKL
    "seqkd": DataPreset(0.0, 0.0, "Kim & Rush 2016, Sequence-Level Knowledge Distillation", "fkl"),
    # KD on a fixed dataset's ground-truth outputs (Hinton et al., 2015; Sanh et al., 2019, DistilBERT)
    "supervised_kd": DataPreset(1.0, 0.0, "Hinton et al. 2015; Sanh et al. 2019 (DistilBERT)", "fkl"),
    # fixed data mixed with the student's own outputs (Lin et al., "Autoregressive Knowledge Distillation
    # through Imitation Learning", EMNLP 2020); ImitKD anneals the mix, DistillSpec fixes it at ½ / ½
    "imitkd": DataPreset(0.5, 0.5, "Lin et al. 2020, ImitKD", "fkl"),
    # teacher and student samples, half each (Wen et al., "f-Divergence Minimization for Sequence-Level
    # Knowledge Distillation", ACL 2023), with total variation distance
    "f_distill": DataPreset(0.0, 0.5, "Wen et al. 2023, f-Distill", "tvd"),
    # fully on-policy: every response sampled from the student (Agarwal et al., "On-Policy Distillation of
    # Language Models: Learning from Self-Generated Mistakes", ICLR 2024, GKD with λ = 1); DistillSpec's
    # recommended recipe
    "gkd": DataPreset(0.0, 1.0, "Agarwal et al. 2024, GKD (on-policy, λ = 1)", "jsd"),
    # TempSpec's online recipe: λ on-policy at τ_kd plus (1 − λ) ground truth (Ouyang et al., 2024)
    "tempspec": DataPreset(ONE_MINUS_LAMBDA, LAMBDA, "Ouyang et al. 2024, online paradigm", "fkl"),
    # specray's original online paradigm: λ on-policy plus (1 − λ) from the τ_kd teacher shards
    "tempspec_teacher": DataPreset(0.0, LAMBDA, "specray's original online paradigm", "fkl"),
}
# the keys of DATA_PRESETS, spelled out for the spec's type (a test keeps the two equal)
DataPresetName = Literal[
    "seqkd", "supervised_kd", "imitkd", "f_distill", "gkd", "tempspec", "tempspec_teacher"
]
DEFAULT_PRESET: DataPresetName = "tempspec_teacher"


class DataSources(BaseModel):
    """Where the online paradigm's batch rows get their responses (DistillSpec Table 1, Algorithm A.2):
    a fraction `fixed` (λ1) the dataset's ground truth, `student` (λ2) on-policy samples at τ_kd, and the
    rest, 1 − fixed − student, the teacher's samples from the τ_kd shards."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fixed: float = Field(default=0.0, ge=0.0, le=1.0, description="λ1: ground-truth outputs of the dataset")
    student: float = Field(default=0.0, ge=0.0, le=1.0, description="λ2: student samples at τ_kd")

    @model_validator(mode="after")
    def _at_most_the_whole_batch(self) -> DataSources:
        if self.fixed + self.student > 1.0 + 1e-9:
            raise ValueError(
                f"fixed ({self.fixed:g}) + student ({self.student:g}) must be <= 1 "
                "(the rest of each batch, 1 - fixed - student, is teacher data)"
            )
        return self

    @property
    def teacher(self) -> float:
        return max(0.0, 1.0 - self.fixed - self.student)


# `distill.data_sources`: a preset name (a string) or explicit fractions (a mapping). The tag shows in
# error paths: distill.data_sources.preset, distill.data_sources.fractions.fixed
DataSourcesField = Annotated[
    Union[Annotated[DataPresetName, Tag("preset")], Annotated[DataSources, Tag("fractions")]],  # noqa: UP007
    Discriminator(lambda value: "preset" if isinstance(value, str) else "fractions"),
]


def source_name(data_sources: str | DataSources | dict) -> str:
    """A short stable name for draft names and MLflow tags: the preset's, or `fixed0.5_student0.5`."""
    if isinstance(data_sources, str):
        return data_sources
    fractions = data_sources if isinstance(data_sources, DataSources) else DataSources(**data_sources)
    return f"fixed{fractions.fixed:g}_student{fractions.student:g}"


def resolve_sources(data_sources: str | DataSources, onpolicy_fraction: float) -> DataSources:
    """The fractions a `distill.data_sources` value stands for, with λ = `onpolicy_fraction`."""
    if isinstance(data_sources, DataSources):
        return data_sources
    fixed, student = DATA_PRESETS[data_sources].fractions(onpolicy_fraction)
    return DataSources(fixed=fixed, student=student)
