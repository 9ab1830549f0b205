"""The `data` section: the instruction sources and the splits drawn from them."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from specray.config.base import Frozen
from specray.config.vocabulary import SYNTHETIC_FAMILIES, resolve_categories

SourceKind = Literal["synthetic", "alpaca", "jsonl", "gsm8k", "self_instruct", "parquet", "spec_bench"]
Template = Literal["alpaca", "chat"]
# the two test sets every sweep has (cut from data.train and data.out_of_domain); data.test_sets adds more
BUILT_IN_TEST_SETS = ("in_domain", "out_of_domain")


class SourceSpec(Frozen):
    """Where examples come from. `synthetic` needs no path; every other kind needs `path` (a local file,
    or for `alpaca` also a hub dataset name such as tatsu-lab/alpaca)."""

    kind: SourceKind
    path: str | None = None
    split: str = "train"
    families: list[str] | None = Field(
        default=None, min_length=1, description="synthetic task families (None = in-domain)"
    )
    size: int = Field(default=4000, ge=1, description="synthetic examples to generate")
    seed: int = 0
    columns: dict[str, str] | None = Field(default=None, description="parquet: Alpaca field -> column name")
    categories: list[str] | None = Field(
        default=None,
        min_length=1,
        description="spec_bench: the categories kept (or the groups mt_bench, spec_bench); None = all",
    )

    @model_validator(mode="after")
    def _path_matches_kind(self) -> SourceSpec:
        if self.kind == "synthetic" and self.path is not None:
            raise ValueError("a synthetic source takes no 'path'")
        if self.kind != "synthetic" and not self.path:
            raise ValueError(f"a {self.kind} source needs 'path' (a local file or dataset name)")
        if self.kind == "synthetic" and self.families:
            unknown = sorted(set(self.families) - set(SYNTHETIC_FAMILIES))
            if unknown:
                allowed = ", ".join(SYNTHETIC_FAMILIES)
                raise ValueError(f"unknown synthetic families {unknown} (allowed: {allowed})")
        if self.categories is not None:
            if self.kind != "spec_bench":
                raise ValueError(f"'categories' filters a spec_bench source, not a {self.kind} one")
            resolve_categories(self.categories, source="categories")  # unknown names list the allowed ones
        return self

    @property
    def has_categories(self) -> bool:
        """Whether its examples carry a category that results are broken down by (Spec-Bench's)."""
        return self.kind == "spec_bench"


class TestSetSpec(Frozen):
    """A named test set: prompts drawn from `source` (seeded by data.seed), `size` of them or all."""

    source: SourceSpec
    size: int | None = Field(
        default=None, ge=1, description="prompts drawn (seeded); None = every one, categories interleaved"
    )


class DataSpec(Frozen):
    """Train source split into train / validation / in-domain test; a separate out-of-domain test source;
    and any further named test sets (`test_sets`, e.g. Spec-Bench or MT-bench by category)."""

    train: SourceSpec
    out_of_domain: SourceSpec
    train_size: int = Field(ge=1)
    validation_size: int = Field(ge=1)
    in_domain_test_size: int = Field(ge=1)
    out_of_domain_test_size: int = Field(ge=1)
    template: Template = Field(
        default="alpaca",
        description="alpaca: the paper's Alpaca prompts; chat: the target tokenizer's own chat template",
    )
    max_prompt_tokens: int = Field(default=256, ge=8)
    seed: int = 0
    test_sets: dict[str, TestSetSpec] = Field(
        default_factory=dict, description="more test sets by name (in_domain and out_of_domain always exist)"
    )

    @field_validator("test_sets")
    @classmethod
    def _test_set_names(cls, v: dict[str, TestSetSpec]) -> dict[str, TestSetSpec]:
        for name in v:
            if name in BUILT_IN_TEST_SETS:
                raise ValueError(f"{name!r} is a built-in test set; give the new one another name")
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", name):
                raise ValueError(
                    f"test set name {name!r}: use lowercase letters, digits and '_' (it names metrics)"
                )
        return v

    @property
    def test_set_names(self) -> tuple[str, ...]:
        """Every test set a sweep can evaluate on: the two built-in ones, then the named ones."""
        return (*BUILT_IN_TEST_SETS, *self.test_sets)

    def test_source(self, test_set: str) -> SourceSpec:
        """Where a test set's prompts come from."""
        if test_set == "in_domain":
            return self.train
        if test_set == "out_of_domain":
            return self.out_of_domain
        return self.test_sets[test_set].source
