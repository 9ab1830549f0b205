"""The names a spec may use for what the data layer defines: Spec-Bench's categories and the category groups
a `categories:` list may name, the workload presets (category -> request temperature), and the synthetic
corpus's task families.

They live with the spec, not with the loaders (`specray.data.spec_bench`, `specray.data.synthetic`), because
the spec validates against them at the edge and the spec sits below the data layer: the loaders import
these names, never the other way round.

MT-bench decodes each category at its own temperature. The `mt_bench` workload is FastChat's table
(`fastchat/llm_judge/common.py`, `temperature_config`): writing and roleplay 0.7, stem and humanities 0.1,
extraction, math, coding and reasoning 0.
"""

from __future__ import annotations

from collections.abc import Iterable

from specray.errors import DataError

MT_BENCH_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)
SPEC_BENCH_CATEGORIES = (*MT_BENCH_CATEGORIES, "translation", "summarization", "qa", "math_reasoning", "rag")
# Named category selections: `categories: [mt_bench]` is MT-bench's eight.
CATEGORY_GROUPS = {"mt_bench": MT_BENCH_CATEGORIES, "spec_bench": SPEC_BENCH_CATEGORIES}

# category -> request temperature (FastChat's llm_judge temperature_config)
WORKLOADS: dict[str, dict[str, float]] = {
    "mt_bench": {
        "writing": 0.7,
        "roleplay": 0.7,
        "extraction": 0.0,
        "math": 0.0,
        "coding": 0.0,
        "reasoning": 0.0,
        "stem": 0.1,
        "humanities": 0.1,
    }
}

# the synthetic corpus's task families (`specray.data.synthetic` generates each): low-entropy ones have one
# right answer, high-entropy ones many; word problems play GSM8K's role as the out-of-domain test set
LOW_ENTROPY = ("arithmetic", "copy", "sort", "count", "reverse", "capitalise")
HIGH_ENTROPY = ("open_list", "describe", "sentence")
IN_DOMAIN = LOW_ENTROPY + HIGH_ENTROPY
OUT_OF_DOMAIN = ("word_problem",)
SYNTHETIC_FAMILIES = IN_DOMAIN + OUT_OF_DOMAIN


def resolve_categories(
    categories: Iterable[str] | None, source: str = "categories"
) -> tuple[str, ...] | None:
    """Expand group names (`mt_bench`) and refuse unknown categories, listing the allowed ones."""
    if categories is None:
        return None
    resolved: list[str] = []
    for name in categories:
        for category in CATEGORY_GROUPS.get(name, (name,)):
            if category not in SPEC_BENCH_CATEGORIES:
                allowed = ", ".join([*CATEGORY_GROUPS, *SPEC_BENCH_CATEGORIES])
                raise DataError(f"{source}: unknown category {name!r}; allowed: {allowed}")
            if category not in resolved:
                resolved.append(category)
    if not resolved:
        raise DataError(f"{source}: an empty category list selects no question")
    return tuple(resolved)
