"""Pure torch math for specray: temperature warp, KD divergences, speculative decoding formulas, lenience.

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
from specray.ops.blocks import (
    BlockCounts,
    draft_stop_after_rejection,
    expected_block_counts,
    sampled_token_acceptance,
)
from specray.ops.divergences import (
    DIVERGENCES,
    forward_kl,
    get_divergence,
    jsd,
    reverse_kl,
    total_variation,
)
from specray.ops.lenience import (
    LENIENCES,
    get_lenience,
    lenience_exp,
    lenience_lin,
    lenience_sq,
    lenient_acceptance,
    lenient_acceptance_from_logits,
    lenient_target,
    lenient_token_acceptance,
    verify_block_lenient,
)
from specray.ops.speculative import verify_block
from specray.ops.warp import log_warp, sample, warp

__all__ = [
    "DIVERGENCES",
    "BlockCounts",
    "LENIENCES",
    "acceptance_from_logits",
    "acceptance_rate_from_counts",
    "block_efficiency_from_counts",
    "draft_acceptance_from_counts",
    "draft_stop_after_rejection",
    "expected_block_counts",
    "expected_block_efficiency",
    "forward_kl",
    "get_divergence",
    "get_lenience",
    "jsd",
    "lenience_exp",
    "lenience_lin",
    "lenience_sq",
    "lenient_acceptance",
    "lenient_acceptance_from_logits",
    "lenient_target",
    "lenient_token_acceptance",
    "log_warp",
    "reverse_kl",
    "sample",
    "sampled_token_acceptance",
    "simulated_block_efficiency",
    "speedup_model",
    "token_acceptance",
    "total_variation",
    "verify_block",
    "verify_block_lenient",
    "warp",
]
