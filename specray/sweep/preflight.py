"""The checks a sweep (or a garden) runs before any work: what can be refused in seconds, before MLflow runs
are created or Ray starts."""

from __future__ import annotations

import json
from pathlib import Path

from specray.config import ModelRef, SweepSpec
from specray.data.chat import require_chat_template
from specray.errors import SpecError
from specray.files import cache_dir, check_writable
from specray.models.loading import load_tokenizer
from specray.models.sources import model_path
from specray.sweep.plan import sweep_dir


def preflight(spec: SweepSpec) -> None:
    """Everything that can be checked in seconds, before MLflow runs are created or Ray starts: the output
    and cache folders are writable; a GGUF file is one specray can load; a cut keeps fewer layers than the
    target has; and models that are folders already (by name or path, or a GGUF file's dequantised folder)
    have a tokenizer, safetensors weights, the chat template the spec asks for and one shared vocabulary
    (zoo entries are built later and share one tokenizer by construction, as does a draft made from the
    target). The data sources were loaded into the configured splits by the plan, before this."""
    from specray.models.loading import check_model_dir, check_same_vocabulary

    check_writable(sweep_dir(spec), "output_dir", "choose another with output_dir=PATH")
    check_writable(cache_dir(), "the cache folder", "set SPECRAY_CACHE to a writable folder")
    refs = {"target": spec.models.target, "draft": spec.models.draft}
    layers = {name: _gguf_layers(ref) for name, ref in refs.items() if ref.gguf is not None}
    _check_cut(spec, layers.get("target"))
    paths = {name: folder for name, ref in refs.items() if (folder := _folder(spec, ref)) is not None}
    tokenizers = {name: load_tokenizer(path, refs[name].trust_remote_code) for name, path in paths.items()}
    for path in paths.values():
        check_model_dir(path)
    if spec.data.template == "chat" and "target" in tokenizers:  # the zoo's tokenizer carries one
        require_chat_template(tokenizers["target"], paths["target"])
    if len(tokenizers) == 2:
        check_same_vocabulary(tokenizers["target"], tokenizers["draft"], paths["target"], paths["draft"])


def _gguf_layers(ref: ModelRef) -> int:
    from specray.models.gguf import check_gguf, require_gguf

    return check_gguf(require_gguf(str(ref.gguf)))


def _folder(spec: SweepSpec, ref: ModelRef) -> str | None:
    """The folder (or hub name) of a model that is one already; None for what specray makes later."""
    if ref.name_or_path is not None:
        return ref.name_or_path
    if ref.gguf is not None and Path(folder := model_path(ref, spec.models)).is_dir():
        return folder
    return None


def _check_cut(spec: SweepSpec, gguf_layers: int | None) -> None:
    """A cut keeps fewer layers than the target has (read from the GGUF file, the target's config or the zoo
    recipe; a hub model's is checked when the cut is made)."""
    cut, target = spec.models.draft.cut, spec.models.target
    if cut is None:
        return
    total = gguf_layers
    if target.zoo is not None:
        from specray.models.zoo import shape_of

        total = shape_of(spec.models.zoo, target.zoo).num_layers
    elif target.name_or_path is not None and (Path(target.name_or_path) / "config.json").is_file():
        config = json.loads((Path(target.name_or_path) / "config.json").read_text())
        total = config.get("num_hidden_layers")
    if total and cut.layers >= total:
        raise SpecError(
            f"models.draft.cut.layers: {cut.layers} keeps every layer of the target ({total}); give 1 to "
            f"{total - 1}"
        )
