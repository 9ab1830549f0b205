"""The teacher: generation engines (transformers, vLLM) and the Ray teacher pool that fills τ_kd shards.

`specray.teacher.generation` holds the request and result types, `specray.teacher.engines` the engines
(Ray-free and config-free at import; the transformers engine decodes with `specray.sampling`, which the
distillation loop and the estimators share); only `specray.teacher.pool` imports Ray. Nothing is imported
here.
"""
