"""Load models and tokenizers from a local folder or HF hub name — one code path for every source
(`sources.py` turns a zoo entry, a GGUF file or a derived draft into a folder first).

Weights load from safetensors only (no pickle), and `trust_remote_code` stays off unless the spec says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from safetensors import SafetensorError

from specray.errors import ModelError
from specray.named_files import looks_like_local_model, missing_model_message

# transformers loads where it is used: its tokenizers in `load_tokenizer` (~0.7 CPU s), its model code
# (AutoModelForCausalLM, PreTrainedModel: seconds of imports) in `load_model`. A driver that only plans,
# tokenizes and reports never pays for the model code, and a process that only unpickles what names this
# module (Ray Train's controller, with every run) pays for neither.
if TYPE_CHECKING:  # loading a model needs no config (and no pydantic): the GPU test suite loads models bare
    from transformers import GenerationMixin, PreTrainedModel, PreTrainedTokenizerBase

    class CausalLM(PreTrainedModel, GenerationMixin):
        """What `load_model` returns, for type hints only: transformers' causal LMs inherit both, and
        `generate` comes from GenerationMixin, which PreTrainedModel alone lacks."""


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def _require_dir(path: str) -> None:
    if (problem := missing_model_message(path)) is not None:
        raise ModelError(problem)


def load_tokenizer(path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    _require_dir(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot load a tokenizer ({_first_line(e)})") from None
    if tokenizer.pad_token_id is None:  # Llama-2 has no pad token; padding is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def decode_text(tokenizer: PreTrainedTokenizerBase, token_ids: list[int] | torch.Tensor) -> str:
    """The text of one sequence of token ids, special tokens dropped."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    assert isinstance(text, str), "one sequence decodes to one string (a list comes from a batch only)"
    return text


def check_model_dir(path: str) -> None:
    """What `load_model` needs from a local dir, checked without loading weights: the dir, a readable
    config.json and safetensors weights. Hub names are left to `load_model`."""
    _require_dir(path)
    if not looks_like_local_model(path):
        return
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot read the model config ({_first_line(e)})") from None
    _require_safetensors(path)


def _require_safetensors(path: str) -> None:
    if looks_like_local_model(path) and not any(Path(path).glob("*.safetensors")):
        raise ModelError(f"{path}: no *.safetensors weights (specray loads safetensors only)")


def load_model(
    path: str, dtype: str = "auto", trust_remote_code: bool = False, device: str | torch.device = "cpu"
) -> CausalLM:
    """A causal LM in eval mode; `path` is a local HF model dir or a hub name."""
    from transformers import AutoModelForCausalLM

    _require_dir(path)
    _require_safetensors(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, use_safetensors=True
        )
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise ModelError(f"{path}: cannot load the model ({_first_line(e)})") from None
    # transformers types `to` through a decorator whose hint takes the model as the first argument
    return cast("CausalLM", model.to(device).eval())  # type: ignore[arg-type]


def check_same_vocabulary(
    target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase, target_name: str, draft_name: str
) -> None:
    """Speculative decoding compares token ids, so target and draft must share one vocabulary."""
    if target.get_vocab() != draft.get_vocab():
        only_target = len(set(target.get_vocab()) - set(draft.get_vocab()))
        raise ModelError(
            f"draft {draft_name} and target {target_name} have different vocabularies "
            f"({len(draft)} vs {len(target)} tokens, {only_target} target tokens missing from the draft); "
            "speculative decoding needs one shared tokenizer"
        )


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
