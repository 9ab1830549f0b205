"""Drafts made from a real target: cut from its first layers, or a small fresh model with its vocabulary.

A draft must share the target's tokenizer (speculative decoding compares token ids). For a target a user
downloads there is rarely a ready small model with the same vocabulary, so specray makes one:

- **cut** (`CutSpec`): the target's embeddings, its first k decoder layers, its final norm and its LM head
  (tied where the target ties them). It starts from the target's own token representations, so a few
  hundred distillation steps move it a long way; its cost is the k layers plus the head, which at a large
  vocabulary is most of a small draft's step.
- **fresh** (`FreshSpec`): a new model of the target's architecture and vocabulary at a small shape,
  initialised from a seed; where its width equals the target's, the embeddings (and tied head) are copied.

Either is written once as a transformers folder in the cache, named by a hash of the target's identity and
the recipe, and then loads like any model. Both keep the target's config class (a Llama target gives a
Llama draft): only the layer count and, for fresh, the shape change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from specray.errors import ModelError
from specray.files import cache_dir, publish_folder, write_json
from specray.locks import producing

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from specray.config import CutSpec, FreshSpec

log = logging.getLogger(__name__)

RECIPE_FILE = "derived.json"  # what a derived folder was made from: its marker of completion


def derived_dir(digest: str, kind: str) -> Path:
    """The cache folder of a derived draft (whether or not it is made yet)."""
    return cache_dir() / "models" / f"{kind}-{digest}"


def make_derived(
    folder: Path,
    target_path: str,
    recipe: CutSpec | FreshSpec,
    info: dict,
    note: Callable[[str], None] = log.info,
) -> Path:
    """Make (once) the draft `recipe` describes from the target at `target_path`, in `folder`."""
    from specray.config import CutSpec

    kind = "cut" if isinstance(recipe, CutSpec) else "fresh"
    if not (folder / RECIPE_FILE).is_file():
        with producing([folder], f"the {kind} draft", note):
            if not (folder / RECIPE_FILE).is_file():
                publish_folder(
                    folder, lambda tmp: _write_derived(tmp, target_path, recipe, info | {"kind": kind})
                )
                note(f"made the {kind} draft in {folder}")
    return folder


def _write_derived(folder: Path, target_path: str, recipe: CutSpec | FreshSpec, info: dict) -> None:
    from transformers.utils import logging as hf_logging

    from specray.config import CutSpec
    from specray.models.loading import load_model, load_tokenizer
    from specray.progress import live_display

    if not live_display():  # transformers' "Writing model shards" bar redraws with \r: noise in a log
        hf_logging.disable_progress_bar()
    target = load_model(target_path, "float32")
    draft = cut(target, recipe.layers) if isinstance(recipe, CutSpec) else fresh(target, recipe)
    draft.save_pretrained(folder, safe_serialization=True)
    load_tokenizer(target_path).save_pretrained(folder)
    write_json(folder / RECIPE_FILE, info | {"parameters": sum(p.numel() for p in draft.parameters())})


def _layer_count(config: PretrainedConfig) -> int:
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int):
        raise ModelError(f"{type(config).__name__}: no num_hidden_layers; a draft cannot be cut from it")
    return layers


def cut(target: PreTrainedModel, layers: int) -> PreTrainedModel:
    """A copy of `target` with only its first `layers` decoder layers (embeddings, norm and head kept)."""
    import copy

    total = _layer_count(target.config)
    if not 1 <= layers < total:
        raise ModelError(
            f"models.draft.cut.layers: {layers} must be between 1 and {total - 1} (the target has {total})"
        )
    decoder = getattr(target, "model", None)
    if decoder is None or not hasattr(decoder, "layers"):
        raise ModelError(f"{type(target).__name__}: no model.layers; specray cuts decoder-only LMs only")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):  # per-layer attention kinds, where kept
        config.layer_types = config.layer_types[:layers]
    draft = type(target)(config)
    kept = {k: v for k, v in target.state_dict().items() if _kept(k, layers)}
    missing, unexpected = draft.load_state_dict(kept, strict=False)
    if unexpected or [k for k in missing if not _tied_head(k, config)]:
        raise ModelError(
            f"cutting {type(target).__name__}: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    return draft


def _kept(name: str, layers: int) -> bool:
    parts = name.split(".")
    if "layers" in parts:
        index = parts[parts.index("layers") + 1]
        return index.isdigit() and int(index) < layers
    return True


def _tied_head(name: str, config: PretrainedConfig) -> bool:
    return name.startswith("lm_head.") and bool(getattr(config, "tie_word_embeddings", False))


def fresh(target: PreTrainedModel, shape: FreshSpec) -> PreTrainedModel:
    """A new model of the target's class and vocabulary at `shape`, initialised from `shape.seed`; the
    embeddings are the target's where the widths agree."""
    import copy

    import torch

    config = copy.deepcopy(target.config)
    config.hidden_size = shape.hidden_size
    config.num_hidden_layers = shape.num_layers
    config.num_attention_heads = shape.num_heads
    config.num_key_value_heads = shape.num_heads
    config.intermediate_size = shape.intermediate_size
    config.head_dim = shape.hidden_size // shape.num_heads
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:1] * shape.num_layers
    torch.manual_seed(shape.seed)
    draft = type(target)(config)
    if shape.hidden_size == target.config.hidden_size:
        pairs = [(draft.get_input_embeddings(), target.get_input_embeddings())]
        if not config.tie_word_embeddings:  # a tied head is the embeddings already
            pairs.append((draft.get_output_embeddings(), target.get_output_embeddings()))
        with torch.no_grad():
            for mine, theirs in pairs:
                cast(torch.nn.Linear, mine).weight.copy_(cast(torch.nn.Linear, theirs).weight)
    return draft
