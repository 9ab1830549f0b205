"""Result keys: every cached result is stored under a hash of everything that made it, and nothing else.

- `fields`   every spec field classified by which keys it reaches (`FIELDS`), and a spec's direct inputs
- `format`   the one format version of keys and records, the hash (`digest`) and why a key changed
- `recipes`  what a draft, its curves, the step costs, a cell, a garden point and the target's earlier
             answers depend on; the sweep's key
- `shards`   the teacher shards' keys

This package is where keys are computed (with `specray.draft` and the plans); the names below are its public
face, imported as `from specray.keys import draft_key_inputs`.
"""

from specray.keys.fields import FIELDS, Direct, Via, classification, direct_inputs, leaf_fields
from specray.keys.format import (
    FORMAT_VERSION,
    OlderFormat,
    check_format,
    describe_change,
    digest,
    older_format_line,
)
from specray.keys.recipes import (
    answers_key,
    canonical_mixture,
    cell_key_inputs,
    cost_ratio_inputs,
    curve_inputs,
    draft_key_inputs,
    garden_point_key,
    prompt_ids_key,
    spec_key,
)
from specray.keys.shards import engine_id, shard_key, teacher_id, train_shard_keys

__all__ = [
    "FIELDS",
    "FORMAT_VERSION",
    "Direct",
    "OlderFormat",
    "Via",
    "answers_key",
    "canonical_mixture",
    "cell_key_inputs",
    "check_format",
    "classification",
    "cost_ratio_inputs",
    "curve_inputs",
    "describe_change",
    "digest",
    "direct_inputs",
    "draft_key_inputs",
    "engine_id",
    "garden_point_key",
    "leaf_fields",
    "older_format_line",
    "prompt_ids_key",
    "shard_key",
    "spec_key",
    "teacher_id",
    "train_shard_keys",
]
