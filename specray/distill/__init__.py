"""Distillation of the draft towards the target: offline SeqKD and online KD, τ_kd mixtures, checkpoints.

`loop.train_draft` runs in one process without Ray; `ray_train.distill` runs the same loop under Ray Train
(DDP, fault tolerance) and is not imported here, so importing `specray.distill` never imports Ray.
"""

from specray.distill.checkpoints import is_finished
from specray.distill.inputs import DistillInputs, draft_name, parse_mixture, prepare_inputs
from specray.distill.loop import DistillResult, train_draft

__all__ = [
    "DistillInputs",
    "DistillResult",
    "draft_name",
    "is_finished",
    "parse_mixture",
    "prepare_inputs",
    "train_draft",
]
