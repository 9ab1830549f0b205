"""Deterministic train / validation / test splits and a content fingerprint of an example list.

The split depends only on the examples' order, the sizes and the seed (an explicit `random.Random(seed)`,
never the global RNG or `hash()`), so every process and rerun sees the same split. The fingerprint is
part of the teacher shard key, so it must be stable across processes and change with any field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Mapping, Sequence

from specray.data.examples import Example
from specray.errors import DataError

REMAINDER = -1  # a split size meaning "all examples the other splits leave"


def split_examples(
    examples: Sequence[Example], sizes: Mapping[str, int], seed: int
) -> dict[str, list[Example]]:
    """Shuffle with `seed`, then cut consecutive slices in the order of `sizes`.

    Example: `split_examples(xs, {"validation": 100, "in_domain_test": 200, "train": -1}, seed=0)`.
    A size of -1 (at most one) takes all remaining examples. Asking for more than exist is a DataError.
    """
    counts = _resolve_sizes(sizes, len(examples))
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    splits: dict[str, list[Example]] = {}
    start = 0
    for name, count in counts.items():
        splits[name] = [examples[i] for i in order[start : start + count]]
        start += count
    return splits


def _resolve_sizes(sizes: Mapping[str, int], available: int) -> dict[str, int]:
    """Check the sizes and replace the -1 entry by the number of examples left over."""
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < REMAINDER:
            raise ValueError(
                f"split size for {name!r} must be an integer >= 0 or -1 (the rest), got {size!r}"
            )
    remainder_names = [name for name, size in sizes.items() if size == REMAINDER]
    if len(remainder_names) > 1:
        raise ValueError(f"at most one split may have size -1 (the rest); got {', '.join(remainder_names)}")
    asked = sum(size for size in sizes.values() if size != REMAINDER)
    if asked > available:
        raise DataError(f"split sizes {dict(sizes)} ask for {asked} examples, but only {available} exist")
    return {name: available - asked if size == REMAINDER else size for name, size in sizes.items()}


def fingerprint(examples: Sequence[Example]) -> str:
    """First 16 hex chars of a sha256 over every example's fields, in order (order changes the result)."""
    digest = hashlib.sha256()
    for example in examples:
        # json.dumps escapes newlines, so "\n" separates records unambiguously.
        fields = dataclasses.asdict(example)
        for name in ("turns", "references"):  # single-turn examples keep the fingerprint they had before
            if not fields[name]:
                del fields[name]
        record = json.dumps(fields, sort_keys=True, ensure_ascii=False)
        digest.update(record.encode("utf-8") + b"\n")
    return digest.hexdigest()[:16]
