"""Pure torch math for specray: temperature warp, KD divergences, speculative decoding formulas.

Imports only torch and the standard library (never ray, mlflow, vllm or transformers), so it runs anywhere
and is cheap to test; tests/unit/test_import_boundaries.py enforces this.
"""

from __future__ import annotations

from specray.ops.acceptance import (
    acceptance_from_logits,
    acceptance_rate_from_counts,
    block_efficiency_from_counts,
    draft_acceptance_from_counts,
    expected_block_efficiency,
    simulated_block_efficiency,
    speedup_model,
    token_acceptance,
)
from specray.ops.divergences import (
    DIVERGENCES,
    forward_kl,
    get_divergence,
    jsd,
    reverse_kl,
    total_variation,
)
from specray.ops.speculative import verify_block, verify_greedy
from specray.ops.warp import log_warp, sample, warp

__all__ = [
    "DIVERGENCES",
    "acceptance_from_logits",
    "acceptance_rate_from_counts",
    "block_efficiency_from_counts",
    "draft_acceptance_from_counts",
    "expected_block_efficiency",
    "forward_kl",
    "get_divergence",
    "jsd",
    "log_warp",
    "reverse_kl",
    "sample",
    "simulated_block_efficiency",
    "speedup_model",
    "token_acceptance",
    "total_variation",
    "verify_block",
    "verify_greedy",
    "warp",
]
