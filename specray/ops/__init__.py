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
    expected_target_calls,
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
    AVERAGINGS,
    DIVERGENCES,
    Averaging,
    averaging_units,
    chunked_rows,
    forward_kl,
    get_divergence,
    get_per_token_divergence,
    jsd,
    masked_average,
    masked_sum,
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
from specray.ops.speculative import verify_block, verify_greedy
from specray.ops.warp import log_warp, sample, warp

__all__ = [
    "AVERAGINGS",
    "DIVERGENCES",
    "BlockCounts",
    "LENIENCES",
    "Averaging",
    "acceptance_from_logits",
    "acceptance_rate_from_counts",
    "averaging_units",
    "block_efficiency_from_counts",
    "chunked_rows",
    "draft_acceptance_from_counts",
    "draft_stop_after_rejection",
    "expected_block_counts",
    "expected_block_efficiency",
    "expected_target_calls",
    "forward_kl",
    "get_divergence",
    "get_lenience",
    "get_per_token_divergence",
    "jsd",
    "lenience_exp",
    "lenience_lin",
    "lenience_sq",
    "lenient_acceptance",
    "lenient_acceptance_from_logits",
    "lenient_target",
    "lenient_token_acceptance",
    "log_warp",
    "masked_average",
    "masked_sum",
    "reverse_kl",
    "sample",
    "sampled_token_acceptance",
    "simulated_block_efficiency",
    "speedup_model",
    "token_acceptance",
    "total_variation",
    "verify_block",
    "verify_block_lenient",
    "verify_greedy",
    "warp",
]
