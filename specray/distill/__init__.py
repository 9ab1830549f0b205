"""Distillation of the draft towards the target: offline SeqKD and online KD, τ_kd mixtures, checkpoints.

`loop.train_draft` runs in one process without Ray; `ray_train.distill` runs the same loop under Ray Train
(DDP, fault tolerance). Nothing is imported here: `specray.distill.losses` (or the probe) is importable
without Ray and without the config (pydantic), as on a bare GPU machine (tests/gpu/).
"""
