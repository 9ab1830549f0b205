"""The learning-rate schedule of every training loop (the distillation loop, the tiny zoo's pre-training).

A multiplier of the base learning rate, for `torch.optim.lr_scheduler.LambdaLR`: a linear warm-up, then a
cosine decay to `min_ratio` of the base rate (nanoGPT), not to 0, so the last steps still learn.
"""

from __future__ import annotations

import math

MIN_LR_RATIO = 0.1


def warmup_cosine(
    step: int,
    warmup_steps: int,
    total_steps: int,
    min_ratio: float = MIN_LR_RATIO,
    *,
    ramp_steps: int | None = None,
) -> float:
    """Multiplier of the base rate after `step` optimizer steps.

    Warm-up: (step + 1) / ramp_steps while step < warmup_steps. `ramp_steps` defaults to warmup_steps + 1,
    so the full rate comes at the first step of the decay; ramp_steps = warmup_steps reaches it at the
    last warm-up step already (the zoo's pre-training: its cached models were trained so). Decay: cosine
    from 1 at step = warmup_steps to `min_ratio` at step = total_steps, and `min_ratio` after it.
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1 if ramp_steps is None else ramp_steps)
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
