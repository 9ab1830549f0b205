"""Temperature warp p_τ = softmax(logits / τ) and sampling from it.

Draft and target are warped with the same decoding temperature τ_dec; τ = 0 means greedy (one-hot argmax).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_tau(tau: float) -> None:
    if not tau >= 0.0:  # written this way so NaN is rejected too
        raise ValueError(f"tau must be >= 0, got {tau!r}")


def warp(logits: Tensor, tau: float) -> Tensor:
    """Probabilities p_τ = softmax(logits / τ) over the last dim, in fp32.

    logits: [..., vocab] (any dtype) -> [..., vocab] float32.
    τ = 0 gives the one-hot argmax distribution; ties go to the first max index (torch.argmax).
    """
    _check_tau(tau)
    logits = logits.float()  # bf16 softmax loses too much mass in the tail
    if tau == 0.0:
        greedy = logits.argmax(dim=-1)  # [...]
        return torch.nn.functional.one_hot(greedy, logits.shape[-1]).to(torch.float32)
    return torch.softmax(logits / tau, dim=-1)


def log_warp(logits: Tensor, tau: float) -> Tensor:
    """Log-probabilities log_softmax(logits / τ) over the last dim, in fp32.

    logits: [..., vocab] -> [..., vocab] float32. τ must be > 0: the log of a one-hot is -inf, so greedy
    callers must use `warp`.
    """
    _check_tau(tau)
    if tau == 0.0:
        raise ValueError(
            "tau must be > 0 for log_warp (log of the one-hot greedy distribution is -inf); use warp"
        )
    return torch.log_softmax(logits.float() / tau, dim=-1)


def sample(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw one token index per row of a probability tensor: exactly `torch.multinomial(probs, 1)`.

    probs: [..., vocab] (rows need not be normalised) -> [...] int64.
    For one sample torch.multinomial draws q ~ Exp(1) over the whole row and returns argmax(p / q) (the
    exponential race, ATen's `multinomial` fast path); this runs the same three ops on the same generator, so
    the result and the generator's state afterwards are the same bit for bit. What it leaves out are
    multinomial's input checks (finite, non-negative, positive sum), which cost three device syncs per call
    on CUDA: callers pass softmax outputs or clamped residuals with mass.
    """
    flat = probs.reshape(-1, probs.shape[-1]).float()  # [rows, vocab]
    race = torch.empty_like(flat).exponential_(1.0, generator=generator)
    return torch.argmax(flat / race, dim=-1).reshape(probs.shape[:-1])
