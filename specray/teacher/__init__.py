"""The teacher: generation engines (transformers, vLLM) and the Ray teacher pool that fills τ_kd shards.

`specray.teacher.engines` is Ray-free and config-free at import (the distillation loop and the analytic
estimator reuse its `sample_batch`); only `specray.teacher.pool` imports Ray. Nothing is imported here.
"""
