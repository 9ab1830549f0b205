"""Every seed specray derives from a run's seed, in one place (pure Python: no torch, no numpy).

Two kinds:
- *hashed* seeds (`derive_seed`, `request_seed`): sha256 over the parts, never Python's `hash()` (salted
  per process), so every process and machine derives the same seed; 63 bits, a valid torch seed.
- *indexed* seeds (`prompt_seed`, `decode_seed`): the run seed spread by large multipliers, one per
  prompt (and per repeat of a prompt), so a prompt's sample does not depend on its batch.

A changed formula changes every sampled row and every result: the cache keys would not notice.
"""

from __future__ import annotations

import hashlib

SEP = "\x1f"  # ASCII unit separator: no part's text contains it, so ("a", "bc") and ("ab", "c") differ
# Strides: distinct (seed, prompt, repeat) get distinct seeds while repeats < REPEAT_STRIDE and the
# prompts' offsets stay under PROMPT_STRIDE; a changed stride changes every sampled row.
PROMPT_STRIDE = 1_000_003
REPEAT_STRIDE = 1_009


def _hashed(text: str) -> int:
    """The first 8 bytes of sha256(text), little-endian, as a 63-bit non-negative int."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def derive_seed(*parts: object) -> int:
    """A seed from any parts (their `repr`s joined), e.g. (seed, "student", step, micro-batch, row)."""
    return _hashed(SEP.join(repr(p) for p in parts))


def request_seed(seed: int, prompt_id: str, tau: float) -> int:
    """The sampler seed of one teacher request: (run seed, prompt id, τ). τ is part of it so that shards at
    neighbouring τ_kd are independent draws, not one random stream re-warped."""
    return _hashed(f"{seed}{SEP}{prompt_id}{SEP}{float(tau)!r}")


def prompt_seed(seed: int, prompt_index: int) -> int:
    """The sampler seed of the `prompt_index`-th prompt of a test set sampled once."""
    return seed * PROMPT_STRIDE + prompt_index


def decode_seed(seed: int, prompt_index: int, repeat: int) -> int:
    """The sampler seed of the `repeat`-th decode of the `prompt_index`-th prompt."""
    return seed * PROMPT_STRIDE + prompt_index * REPEAT_STRIDE + repeat
