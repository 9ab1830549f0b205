"""The teacher: generation engines (transformers, vLLM) and the Ray teacher pool that fills τ_kd shards.

`specray.teacher.engines` is Ray-free (the distillation loop reuses its `sample_batch`); only
`specray.teacher.pool` imports Ray, so it is not imported here.
"""

from specray.teacher.engines import (
    ENGINES,
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    Sample,
    TransformersEngine,
    make_engine,
    request_seed,
    sample_batch,
)

__all__ = [
    "ENGINES",
    "GenerationEngine",
    "GenerationRequest",
    "GenerationResult",
    "Sample",
    "TransformersEngine",
    "make_engine",
    "request_seed",
    "sample_batch",
]
