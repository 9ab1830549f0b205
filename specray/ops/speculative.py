"""One verification step of speculative sampling (Leviathan et al., 2023, Algorithm 1), pure torch.

The draft proposed tokens x_1..x_γ from its warped distributions q_1..q_γ; one target pass gave p_1..p_{γ+1}.
Token x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the replacement
is drawn from the residual norm(max(0, p_i − q_i)), and if all γ are accepted a bonus token comes from
p_{γ+1}. The emitted tokens are then distributed exactly as the target's. At τ = 0 both distributions are
one-hot, so a token is accepted iff it equals the target's argmax and the replacement is that argmax.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specray.ops.warp import sample


def verify_block(
    draft_tokens: Tensor, q: Tensor, p: Tensor, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """Accept a prefix of the draft block and pick the next token.

    draft_tokens: [γ] int64; q: [γ, vocab] draft probs; p: [γ + 1, vocab] target probs (same τ).
    Returns (n_accepted in 0..γ, next_token): the caller emits draft_tokens[:n] then next_token.
    """
    gamma = draft_tokens.shape[0]
    rows = torch.arange(gamma)
    p_x, q_x = p[rows, draft_tokens], q[rows, draft_tokens]  # [γ]
    u = torch.rand(gamma, generator=generator, dtype=p.dtype)
    # u < p/q written without the division; q_x > 0 because x was sampled from q
    accepted = u * q_x < p_x  # [γ]
    rejected = (~accepted).nonzero()
    n = int(rejected[0]) if len(rejected) else gamma
    if n == gamma:
        return n, int(sample(p[gamma], generator))
    residual = (p[n] - q[n]).clamp(min=0.0)  # [vocab]
    # a rejection implies p(x) < q(x), so some mass is left over; guard against fp round-off anyway
    if residual.sum() <= 0:
        residual = p[n]
    return n, int(sample(residual, generator))
