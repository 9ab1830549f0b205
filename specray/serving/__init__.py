"""Export of a sweep's answer for serving: the routing plan (a draft and γ per band of request temperatures,
or no speculation), HF draft folders with metadata, vLLM / SGLang settings, a router, and a check of the
plan with transformers' assisted generation (`specray export`)."""
