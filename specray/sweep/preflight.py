"""The checks a sweep (or a garden) runs before any work: what can be refused in seconds, before MLflow runs
are created or Ray starts."""

from __future__ import annotations

from specray.config import SweepSpec
from specray.data.chat import require_chat_template
from specray.files import cache_dir, check_writable
from specray.models.loading import load_tokenizer
from specray.sweep.plan import sweep_dir


def preflight(spec: SweepSpec) -> None:
    """Everything that can be checked in seconds, before MLflow runs are created or Ray starts: the output
    and cache folders are writable, and models given by name or path have a tokenizer, safetensors weights
    and one shared vocabulary (zoo entries are built later, and share one tokenizer by construction). The
    data sources were loaded into the configured splits by the plan, before this."""
    from specray.models.loading import check_model_dir, check_same_vocabulary

    check_writable(sweep_dir(spec), "output_dir", "choose another with output_dir=PATH")
    check_writable(cache_dir(), "the cache folder", "set SPECRAY_CACHE to a writable folder")
    refs = {"target": spec.models.target, "draft": spec.models.draft}
    # a ref without a zoo entry has a name or path (ModelRef validates exactly one of the two)
    paths = {name: ref.name_or_path for name, ref in refs.items() if ref.name_or_path is not None}
    tokenizers = {name: load_tokenizer(path, refs[name].trust_remote_code) for name, path in paths.items()}
    for path in paths.values():
        check_model_dir(path)
    if spec.data.template == "chat" and "target" in tokenizers:  # the zoo's tokenizer carries one
        require_chat_template(tokenizers["target"], paths["target"])
    if len(tokenizers) == 2:
        check_same_vocabulary(tokenizers["target"], tokenizers["draft"], paths["target"], paths["draft"])
