"""The keys of a sweep's teacher shards: which teacher and engine sampled them, from which prompts, how."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from specray.models.sources import model_id

if TYPE_CHECKING:
    from specray.config import ModelsSpec, SweepSpec, TeacherSpec
    from specray.data.examples import Example
    from specray.data.shards import ShardKey


def teacher_id(models: ModelsSpec) -> str:
    """Stable name of the teacher (the target): `zoo/<zoo key>/target` or the HF name or path."""
    return model_id(models.target, models)


def engine_id(teacher: TeacherSpec) -> str:
    """The engine as the shard key sees it: its name, plus what changes its numbers beyond the model's
    dtype (vLLM's own dtype and context length; a GPU for the transformers engine). Plain `transformers`
    on CPU has no suffix: a CPU shard's key does not depend on how other engines are named."""
    if teacher.engine == "vllm":
        return f"vllm(dtype={teacher.vllm.dtype},max_model_len={teacher.vllm.max_model_len})"
    return "transformers" if teacher.num_gpus == 0 else "transformers(cuda)"


def shard_key(
    spec: SweepSpec, examples: Sequence[Example], tau: float, max_new_tokens: int, seed: int
) -> ShardKey:
    """The key of the shard of `examples` sampled from the sweep's teacher at `tau`."""
    from specray.data.shards import ShardKey
    from specray.data.splits import fingerprint

    return ShardKey(
        teacher=teacher_id(spec.models),
        engine=engine_id(spec.teacher),
        dtype=spec.models.target.dtype,
        dataset=fingerprint(examples),
        template=spec.data.template,
        tau=float(tau),
        max_new_tokens=max_new_tokens,
        seed=seed,
    )


def train_shard_keys(spec: SweepSpec, train: Sequence[Example] | None = None) -> dict[float, ShardKey]:
    """The key of every τ_kd shard of the sweep's train split (`train` saves rebuilding the splits)."""
    if train is None:
        from specray.data.dataset import build_splits

        train = build_splits(spec.data)["train"]
    teacher = spec.teacher
    return {
        tau: shard_key(spec, train, tau, teacher.max_new_tokens, teacher.seed) for tau in teacher.temperatures
    }
