"""One verification step of speculative sampling (Leviathan et al., 2023, Algorithm 1), pure torch.

The draft proposed tokens x_1..x_γ from its warped distributions q_1..q_γ; one target pass gave p_1..p_{γ+1}.
Token x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the replacement
is drawn from the residual norm(max(0, p_i − q_i)), and if all γ are accepted a bonus token comes from
p_{γ+1}. The emitted tokens are then distributed exactly as the target's. At τ = 0 both distributions are
one-hot, so a token is accepted iff it equals the target's argmax and the replacement is that argmax;
`verify_greedy` computes that directly from the logits, with no randomness.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specray.ops.warp import sample


def verify_block(
    draft_tokens: Tensor, q: Tensor, p: Tensor, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """Accept a prefix of the draft block and pick the next token.

    draft_tokens: [γ] int64; q: [γ, vocab] draft probs; p: [γ + 1, vocab] target probs (same τ), all on one
    device, as is `generator`. Returns (n_accepted in 0..γ, next_token): the caller emits draft_tokens[:n]
    then next_token.
    """
    gamma = draft_tokens.shape[0]
    index = draft_tokens[:, None]  # [γ, 1]
    p_x, q_x = p[:gamma].gather(1, index)[:, 0], q.gather(1, index)[:, 0]  # [γ]
    # drawn on p's device: a generator must live where the tensors do (a CUDA generator on CUDA logits)
    u = torch.rand(gamma, generator=generator, dtype=p.dtype, device=p.device)
    # u < p/q written without the division; q_x > 0 because x was sampled from q
    accepted = (u * q_x < p_x).tolist()  # one device sync for the whole block
    n = accepted.index(False) if False in accepted else gamma
    return n, next_token(p, q, n, generator)


def next_token(p: Tensor, q: Tensor, n: int, generator: torch.Generator | None = None) -> int:
    """The token emitted after `n` accepted proposals of a block of γ: a sample of the target's p[γ] when
    all were accepted, else of the residual (p[n] − q[n])+ at the rejected position.

    q: [γ, vocab] draft probs; p: [γ + 1, vocab] target probs. A rejection of x implies p(x) < q(x), also
    in lossy decoding (it accepts when u·q(x) < f(p(x)), and f(p) ≥ p), so the residual has mass; p[n]
    stands in when fp round-off leaves none.
    """
    gamma = q.shape[0]
    if n == gamma:
        return int(sample(p[gamma], generator))
    residual = (p[n] - q[n]).clamp(min=0.0)  # [vocab]
    if residual.sum() <= 0:
        residual = p[n]
    return int(sample(residual, generator))


def verify_greedy(draft_tokens: list[int], target_logits: Tensor) -> tuple[int, int]:
    """`verify_block` at τ = 0, from the target's logits: accept the prefix equal to its argmax, then emit the
    argmax. draft_tokens: γ ints; target_logits: [γ + 1, vocab]. Same result as `verify_block` on one-hot
    p and q, without the random numbers that cannot change it."""
    best = target_logits.argmax(dim=-1).tolist()  # [γ + 1]; ties go to the first index, as in `warp`
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == best[n]:
        n += 1
    return n, best[n]
