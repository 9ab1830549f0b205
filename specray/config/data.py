"""The `data` section: the instruction sources and the splits drawn from them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specray.config.base import Frozen

SourceKind = Literal["synthetic", "alpaca", "jsonl", "gsm8k", "self_instruct", "parquet"]


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

    @model_validator(mode="after")
    def _path_matches_kind(self) -> SourceSpec:
        if self.kind == "synthetic" and self.path is not None:
            raise ValueError("a synthetic source takes no 'path'")
        if self.kind != "synthetic" and not self.path:
            raise ValueError(f"a {self.kind} source needs 'path' (a local file or dataset name)")
        if self.kind == "synthetic" and self.families:
            from specray.data.synthetic import FAMILIES

            unknown = sorted(set(self.families) - set(FAMILIES))
            if unknown:
                raise ValueError(f"unknown synthetic families {unknown} (allowed: {', '.join(FAMILIES)})")
        return self


class DataSpec(Frozen):
    """Train source split into train / validation / in-domain test; a separate out-of-domain test source."""

    train: SourceSpec
    out_of_domain: SourceSpec
    train_size: int = Field(ge=1)
    validation_size: int = Field(ge=1)
    in_domain_test_size: int = Field(ge=1)
    out_of_domain_test_size: int = Field(ge=1)
    template: Literal["alpaca"] = "alpaca"
    max_prompt_tokens: int = Field(default=256, ge=8)
    seed: int = 0
