"""The teacher: generation engines (transformers, vLLM), the Ray teacher pool, and the τ_kd shards it fills.

`specray.teacher.generation` holds the request and result types, `specray.teacher.engines` the engines
(Ray-free and config-free at import; the transformers engine decodes with `specray.sampling`, which the
distillation loop and the estimators share); only `specray.teacher.pool` imports Ray, and
`specray.teacher.shards` turns the pool's results into shards. Nothing is imported here.
"""
