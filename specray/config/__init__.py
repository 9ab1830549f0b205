"""Sweep specs: typed, frozen, validated once at the edge.

A sweep is one YAML file under `sweeps/`. Any mapping in it may pull in a reusable part from `configs/`
with an `include:` key (a path relative to the including file, or to the working directory); the keys next
to `include:` override the included ones. `key=value` overrides from the CLI are applied last
(`eval.gamma=3`, `teacher.temperatures=[0.0,0.5]`). Every bad value fails here, before any work starts, with
its field path and what is allowed.


One module per group of sections (`base`, `models`, `data`, `stages`, `evaluation`, `sweep`) and one
for loading (`loading`); everything is importable from `specray.config`.
"""

from __future__ import annotations

from specray.config.base import (
    MAX_TEMPERATURE,
    Divergence,
    DType,
    Estimator,
    Frozen,
    LenienceFunction,
    Paradigm,
    Temperature,
)
from specray.config.data import BUILT_IN_TEST_SETS, DataSpec, SourceKind, SourceSpec, Template, TestSetSpec
from specray.config.evaluation import EvalSpec, LenienceSpec, TuneSpec, WorkloadSpec
from specray.config.loading import dump_spec, format_validation_error, load_raw, load_spec, validate_part
from specray.config.models import CutSpec, FreshSpec, ModelRef, ModelsSpec, TinyLlamaSpec, ZooSpec
from specray.config.stages import (
    VLLM_MAX_TEMPERATURE,
    VLLM_MIN_POSITIVE_TEMPERATURE,
    DistillSpec,
    Mixture,
    TeacherSpec,
    VllmSpec,
    vllm_accepts_temperature,
)
from specray.config.sweep import RaySpec, SweepSpec, TrackingSpec
from specray.errors import SpecError  # what every bad spec raises

__all__ = [
    "BUILT_IN_TEST_SETS",
    "CutSpec",
    "DType",
    "DataSpec",
    "DistillSpec",
    "Divergence",
    "Estimator",
    "EvalSpec",
    "FreshSpec",
    "Frozen",
    "LenienceFunction",
    "LenienceSpec",
    "MAX_TEMPERATURE",
    "Mixture",
    "ModelRef",
    "ModelsSpec",
    "Paradigm",
    "RaySpec",
    "SourceKind",
    "SourceSpec",
    "SpecError",
    "SweepSpec",
    "TeacherSpec",
    "Template",
    "TestSetSpec",
    "Temperature",
    "TinyLlamaSpec",
    "TrackingSpec",
    "TuneSpec",
    "VLLM_MAX_TEMPERATURE",
    "VLLM_MIN_POSITIVE_TEMPERATURE",
    "VllmSpec",
    "WorkloadSpec",
    "ZooSpec",
    "dump_spec",
    "format_validation_error",
    "load_raw",
    "load_spec",
    "validate_part",
    "vllm_accepts_temperature",
]
