"""Where a model of the spec comes from, what it is called in keys, and its folder — one function each.

A `ModelRef` names one source (`config/models.py`): a zoo entry, an HF name or folder, a GGUF file, or a
draft made from the target (cut or fresh). Every source ends as a transformers folder that `loading.py`
loads the same way; the sources that specray makes (the zoo, a dequantised GGUF file, a derived draft)
live in the cache under a name derived from what determines them:

    model_id            the model's stable name in result keys (moving the cache keeps keys)
    model_path          its folder or hub name, without making anything (the plan's view)
    resolve_model_path  the same, made first where specray makes it (the models stage's view)
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from specray.config import ModelRef, ModelsSpec


def model_id(ref: ModelRef, models: ModelsSpec) -> str:
    """Stable name of a model: `zoo/<zoo key>/<entry>`, `gguf/<file sha256, 16 hex>`, a derived draft's
    recipe with the target's name (`cut(layers=2)/gguf/…`), or the HF name or path. The zoo's target and
    draft are named by the zoo without its size ladder, a ladder entry by its own recipe (`model_key`):
    adding or changing a ladder entry renames no other model. A folder or hub model is named by what the
    spec gives: another model put later at the same path is not told apart, by its own results nor by a
    draft cut from it (name a changed model by another path, or by its GGUF file)."""
    if ref.zoo is not None:
        from specray.models.zoo import MODELS, model_key, zoo_key

        if ref.zoo in MODELS:
            return f"zoo/{zoo_key(models.zoo.model_copy(update={'ladder': {}}))}/{ref.zoo}"
        return f"zoo/{model_key(models.zoo, ref.zoo)}/{ref.zoo}"
    if ref.gguf is not None:
        from specray.models.gguf import value_sha256

        return f"gguf/{value_sha256(ref.gguf)[:16]}"
    if ref.cut is not None:
        return f"cut(layers={ref.cut.layers})/{model_id(models.target, models)}"
    if ref.fresh is not None:
        shape = json.dumps(ref.fresh.model_dump(mode="json"), sort_keys=True)
        return f"fresh({hashlib.sha256(shape.encode()).hexdigest()[:12]})/{model_id(models.target, models)}"
    assert ref.name_or_path is not None  # guaranteed by ModelRef's validator
    return ref.name_or_path


def _derived_folder(ref: ModelRef, models: ModelsSpec) -> str:
    from specray.models.derived import derived_dir

    name = hashlib.sha256(model_id(ref, models).encode()).hexdigest()[:16]
    return str(derived_dir(name, ref.source))


def model_path(ref: ModelRef, models: ModelsSpec) -> str:
    """Where `ref` is, without making anything: its HF name or path, or the folder specray makes (or has
    made) it in (`resolve_model_path` returns the same once it exists)."""
    if ref.zoo is not None:
        from specray.models.zoo import zoo_dir

        return str(zoo_dir(models.zoo) / ref.zoo)
    if ref.gguf is not None:
        from specray.models.gguf import dequantised_dir, value_sha256

        return str(dequantised_dir(value_sha256(ref.gguf)))
    if ref.cut is not None or ref.fresh is not None:
        return _derived_folder(ref, models)
    assert ref.name_or_path is not None  # guaranteed by ModelRef's validator
    return ref.name_or_path


def resolve_model_path(ref: ModelRef, models: ModelsSpec) -> str:
    """The HF name or local folder of `ref`, made first where specray makes it: the zoo is built, a GGUF
    file dequantised, a derived draft made from the (resolved) target."""
    if ref.zoo is not None:
        from specray.models.zoo import build_zoo

        return str(build_zoo(models.zoo).model(ref.zoo))
    if ref.gguf is not None:
        from specray.models.gguf import dequantised

        return str(dequantised(ref.gguf))
    recipe = ref.cut or ref.fresh
    if recipe is not None:
        from pathlib import Path

        from specray.models.derived import make_derived

        target = resolve_model_path(models.target, models)
        info = {"target": model_id(models.target, models), "recipe": recipe.model_dump(mode="json")}
        return str(make_derived(Path(_derived_folder(ref, models)), target, recipe, info))
    assert ref.name_or_path is not None  # guaranteed by ModelRef's validator
    return ref.name_or_path


def load_pair(
    spec: ModelsSpec, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerBase]:
    """Target, draft and their shared tokenizer; refuses a pair with different vocabularies."""
    from specray.models.loading import check_same_vocabulary, load_model, load_tokenizer

    paths = {name: resolve_model_path(getattr(spec, name), spec) for name in ("target", "draft")}
    tokenizers = {name: load_tokenizer(p, getattr(spec, name).trust_remote_code) for name, p in paths.items()}
    check_same_vocabulary(tokenizers["target"], tokenizers["draft"], paths["target"], paths["draft"])
    target, draft = (
        load_model(paths[name], getattr(spec, name).dtype, getattr(spec, name).trust_remote_code, device)
        for name in ("target", "draft")
    )
    return target, draft, tokenizers["target"]
