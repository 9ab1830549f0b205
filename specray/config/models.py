"""The `models` section: the target and the draft, by name or path or from the tiny zoo's recipe."""

from __future__ import annotations

from pydantic import Field, model_validator

from specray.config.base import DType, Frozen


class TinyLlamaSpec(Frozen):
    """Shape of one tiny Llama-architecture model of the zoo."""

    hidden_size: int = Field(ge=8)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=8)
    train_steps: int = Field(ge=1, description="optimizer steps of pre-training")
    lr: float = Field(gt=0, le=1.0)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyLlamaSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        return self


class ZooSpec(Frozen):
    """Recipe of the tiny zoo: a BPE tokenizer, a tiny target and a much smaller draft, trained locally."""

    corpus_size: int = Field(default=20000, ge=16, description="synthetic examples to pre-train on")
    corpus_seed: int = 1234
    vocab_size: int = Field(default=1024, ge=300, le=65536)
    seq_len: int = Field(default=128, ge=16, le=4096, description="packed pre-training sequence length")
    batch_size: int = Field(default=32, ge=1)
    target: TinyLlamaSpec = TinyLlamaSpec(
        hidden_size=256, num_layers=6, num_heads=8, intermediate_size=688, train_steps=240, lr=2e-3
    )
    # The draft sees only ground-truth responses, briefly: the role llama-68m plays for Llama-2 in the paper.
    # One layer: on CPU a tiny model's step is mostly per-layer overhead, so the cost ratio c follows the
    # layer counts rather than the parameter counts; real draft/target pairs have a much smaller c than a
    # tiny CPU pair, hence eval.projected_cost_ratio.
    draft: TinyLlamaSpec = TinyLlamaSpec(
        hidden_size=128, num_layers=1, num_heads=4, intermediate_size=344, train_steps=60, lr=3e-3
    )
    seed: int = 0
    # More targets, trained exactly as the target is (same corpus, tokenizer and schedule) at their own
    # shapes: the size ladder of a model garden (`models.garden`). Empty for an ordinary sweep, and then
    # left out of the zoo's key, so zoos built before ladders keep theirs.
    ladder: dict[str, TinyLlamaSpec] = Field(
        default={}, description="extra zoo targets by name (a model garden's sizes)"
    )

    @model_validator(mode="after")
    def _ladder_names(self) -> ZooSpec:
        for name in self.ladder:
            if name in ("target", "draft") or not name.isidentifier():
                raise ValueError(
                    f"ladder entry {name!r}: a name must be an identifier other than target or draft"
                )
        return self


class CutSpec(Frozen):
    """A draft cut from the target: its embeddings, its first `layers` decoder layers, its final norm and
    its LM head (tied where the target ties them), so it shares the target's tokenizer and starts from
    the target's own representation of every token."""

    # the upper bound only catches a typo early; the real one, fewer than the target's, is checked against
    # the target before any work (`sweep/preflight.py`)
    layers: int = Field(ge=1, le=1024, description="decoder layers kept, from the first")


class FreshSpec(Frozen):
    """A small fresh model with the target's vocabulary (and tokenizer), randomly initialised from `seed`.
    Where `hidden_size` equals the target's, the embeddings (and the tied head) are the target's; other
    weights start from the architecture's own initialisation."""

    hidden_size: int = Field(ge=8, description="width; the target's own keeps its embeddings")
    num_layers: int = Field(ge=1, description="decoder layers")
    num_heads: int = Field(ge=1, description="attention heads (and key-value heads)")
    intermediate_size: int = Field(ge=8, description="MLP width")
    seed: int = Field(default=0, description="initialisation seed")

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> FreshSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if (self.hidden_size // self.num_heads) % 2:  # rotary embeddings rotate pairs of a head's dimensions
            raise ValueError(
                f"hidden_size / num_heads = {self.hidden_size // self.num_heads}: a head's width must be even"
            )
        return self


SOURCES = ("zoo", "name_or_path", "gguf", "cut", "fresh")  # a ModelRef sets exactly one
DERIVED = ("cut", "fresh")  # a draft made from the target: never a target


class ModelRef(Frozen):
    """One model, from exactly one source: an entry of the tiny zoo (`zoo: target`, `draft` or a ladder
    name), an HF hub name or local folder (`name_or_path`), a GGUF file (`gguf`: a path, or a named entry
    such as `smollm2-135m-instruct` that `specray models fetch` brings), or — for a draft — a model made
    from the target (`cut`: its first layers; `fresh`: a small new model with its vocabulary)."""

    zoo: str | None = None
    name_or_path: str | None = None
    gguf: str | None = Field(
        default=None, description="a GGUF file's path, or a named entry (`specray models list`)"
    )
    cut: CutSpec | None = Field(default=None, description="a draft cut from the target's first layers")
    fresh: FreshSpec | None = Field(
        default=None, description="a small fresh draft with the target's vocabulary"
    )
    dtype: DType = "auto"
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelRef:
        given = [name for name in SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of 'zoo' (target, draft or a models.zoo.ladder name), 'name_or_path' "
                "(HF name or path), 'gguf' (a GGUF file or named entry), 'cut' or 'fresh' (a draft made "
                f"from the target){f'; got {len(given)}: ' + ', '.join(given) if given else ''}"
            )
        return self

    @property
    def source(self) -> str:
        """Which of SOURCES this reference uses."""
        return next(name for name in SOURCES if getattr(self, name) is not None)


class ModelsSpec(Frozen):
    target: ModelRef
    draft: ModelRef
    zoo: ZooSpec = ZooSpec()
    # DistillSpec's model garden: targets smallest first, the last the teacher of the others and the same
    # model as `target`; `specray garden` runs it (`specray/garden/`); the sweep commands refuse it
    garden: list[ModelRef] = Field(
        default=[], description="a model garden's targets, smallest first; the last is `target`, the teacher"
    )

    @model_validator(mode="after")
    def _zoo_entries_exist(self) -> ModelsSpec:
        allowed = ("target", "draft", *self.zoo.ladder)
        named = [("target", self.target), ("draft", self.draft)]
        named += [(f"garden[{i}]", ref) for i, ref in enumerate(self.garden)]
        for field, ref in named:
            if ref.zoo is not None and ref.zoo not in allowed:
                raise ValueError(
                    f"{field}.zoo: {ref.zoo!r} is not a model of the zoo; allowed: {', '.join(allowed)}"
                )
        for field, ref in [("target", self.target)] + named[2:]:
            if ref.source in DERIVED:
                raise ValueError(
                    f"{field}.{ref.source}: only the draft can be made from the target; give the {field} "
                    "as zoo, name_or_path or gguf"
                )
        if self.garden:
            if len(self.garden) < 2:
                raise ValueError(
                    "garden: give at least two targets, smallest first (the last is the teacher)"
                )
            if self.garden[-1] != self.target:
                raise ValueError(
                    "garden: its last (largest) model is the teacher and must be the same as `target`"
                )
            if len(set(self.garden)) != len(self.garden):
                raise ValueError("garden: a model is listed twice")
            if self.draft in self.garden:
                raise ValueError("garden: the draft cannot also be one of the garden's targets")
        return self
