"""The benchmarks' quick mode: the same code on a micro zoo and a few rows, so that CI runs every benchmark.

`--quick` is a smoke check, not a measurement: its ratios say nothing about speed. What it guards is that
each benchmark still runs against the library's current API (tests/integration/test_benchmarks_quick.py
runs every quick mode in `make test`). `quick_spec` is sweeps/tiny.yaml with a micro zoo (builds in
seconds), small splits and short responses; `ensure_shards` samples its teacher shards in this process
(the transformers engine, no Ray), so a quick run needs nothing made beforehand.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from benchmarks import REPO
from specray.config import SweepSpec, load_spec


def _llama(hidden: int, intermediate: int, train_steps: int) -> dict:
    shape = {"hidden_size": hidden, "num_layers": 1, "num_heads": 2, "intermediate_size": intermediate}
    return shape | {"train_steps": train_steps, "lr": 3e-3}


# the tests' micro zoo (tests/conftest.py): real Llama models, pre-trained for a handful of steps
MICRO_ZOO = {
    "corpus_size": 300,
    "vocab_size": 320,
    "seq_len": 64,
    "batch_size": 8,
    "target": _llama(32, 64, 6),
    "draft": _llama(16, 32, 3),
}
QUICK_OVERRIDES = (
    f"models.zoo={json.dumps(MICRO_ZOO)}",  # JSON is YAML
    "data.train={kind: synthetic, size: 200, seed: 7}",
    "data.out_of_domain={kind: synthetic, families: [word_problem], size: 40, seed: 8}",
    "data.train_size=32",
    "data.validation_size=8",
    "data.in_domain_test_size=8",
    "data.out_of_domain_test_size=8",
    "teacher.temperatures=[0.0,1.0]",
    "teacher.max_new_tokens=12",
    "distill.batch_size=4",
    "distill.max_new_tokens=8",
    "distill.warmup_steps=1",
    "eval.temperatures=[0.0,1.0]",
    "eval.empirical_temperatures=[1.0]",
    "eval.max_new_tokens=8",
    "eval.empirical_prompts=2",
    "eval.repeats=1",
)


def quick_spec(overrides: Sequence[str] = ()) -> SweepSpec:
    """sweeps/tiny.yaml shrunk to the micro zoo (then `overrides`), with its teacher shards made."""
    spec = load_spec(REPO / "sweeps" / "tiny.yaml", [*QUICK_OVERRIDES, *overrides])
    ensure_shards(spec)
    return spec


def tiny_or_quick(quick: bool) -> Callable[[Sequence[str]], SweepSpec]:
    """The spec loader of a benchmark: sweeps/tiny.yaml, or the quick spec."""
    if quick:
        return quick_spec
    return lambda overrides=(): load_spec(REPO / "sweeps" / "tiny.yaml", list(overrides))


class _InProcessPool:
    """The teacher pool's protocol over one transformers engine in this process."""

    def __init__(self, model_path: str, batch_size: int) -> None:
        from specray.teacher.engines import TransformersEngine

        self.engine = TransformersEngine(model_path, batch_size=batch_size)

    def generate(self, requests, on_results) -> None:
        on_results(self.engine.generate(list(requests)))


def ensure_shards(spec: SweepSpec) -> None:
    """Every τ_kd shard of the spec's train split (reused when cached; sampled here otherwise)."""
    from specray.data.dataset import build_splits
    from specray.keys import train_shard_keys
    from specray.models.sources import resolve_model_path
    from specray.teacher.shards import generate_shards

    teacher = spec.teacher
    pool = _InProcessPool(resolve_model_path(spec.models.target, spec.models), teacher.batch_size)
    train = build_splits(spec.data)["train"]
    generate_shards(
        spec,
        train,
        train_shard_keys(spec, train),
        pool=pool,
        show_progress=False,
    )
