"""The GPU suite: specray's device paths on a freshly built Llama-shaped model on CUDA.

Every test here is marked `gpu` and skips, with its reason, where torch sees no CUDA device; nothing else
excludes it. It imports no Ray, MLflow or pydantic (`tests/unit/test_import_boundaries.py` checks), so it
runs on a bare GPU machine with torch, transformers, numpy, scipy and pytest:

    PYTHONPATH=. python -m pytest tests/gpu -q

The target is a random-initialised Llama shape with Llama-2's 32,000-token vocabulary, built here (no
download), its LM head scaled up so that its next-token distributions are peaked (a few tokens hold most of
the mass, as a trained model's do; random init alone is near-uniform over 32k tokens), which keeps the
chi-square test's cells few. The draft is the target with Gaussian noise on every matrix: it agrees with
the target on about half its tokens (β ≈ 0.5 at τ_dec 0.6-1), like a distilled draft, so the decoder's
accept and reject paths both run; two independent random models agree on almost none (β < 0.03) at
this peakedness. Both are saved with a word-level tokenizer of the same size, so the path-based loaders
(`Evaluator`, `TransformersEngine`) load them like any HF model dir.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

VOCAB = 32_000
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
HEAD_SCALE = 30.0  # logits' spread ≈ 0.02 × √hidden × 30: top tokens hold most of the mass
DRAFT_NOISE = 0.1  # the draft's noise, relative to each matrix's std: β ≈ 0.5


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


def word_tokenizer():
    """A word-level tokenizer of VOCAB ids: the 4 specials, then `w4` ... `w31999` (whitespace-split)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([PAD, BOS, EOS, UNK])}
    vocab |= {f"w{i}": i for i in range(len(vocab), VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )


def llama(hidden: int, layers: int, seed: int):
    """A random-initialised Llama with VOCAB tokens and a scaled LM head, fp32, in eval mode (CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 32 * 32 + 32,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    return model


def perturbed(model, relative_noise: float, seed: int):
    """A copy of `model` with Gaussian noise of `relative_noise` × its std added to every matrix."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in draft.parameters():
            if weight.dim() > 1:
                weight.add_(torch.randn(weight.shape, generator=generator) * weight.std() * relative_noise)
    return draft


@dataclass(frozen=True)
class Pair:
    """A target and a draft saved as HF model dirs (safetensors + the shared tokenizer)."""

    target: Path
    draft: Path


@pytest.fixture(scope="session")
def pair_dirs(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    root = tmp_path_factory.mktemp("gpu-pair")
    tokenizer = word_tokenizer()
    target = llama(256, 2, seed=1)
    for name, model in {"target": target, "draft": perturbed(target, DRAFT_NOISE, seed=0)}.items():
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return Pair(root / "target", root / "draft")


@pytest.fixture(scope="session")
def cuda_pair(pair_dirs: Pair):
    """(target, draft) loaded on cuda:0, fp32, eval mode."""
    from specray.models.loading import load_model

    return (
        load_model(str(pair_dirs.target), "float32", device="cuda:0"),
        load_model(str(pair_dirs.draft), "float32", device="cuda:0"),
    )


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    """Eight prompts of 6 to 20 random token ids (after <s>), fixed by a seed."""
    generator = torch.Generator().manual_seed(11)
    lengths = torch.randint(6, 21, (8,), generator=generator).tolist()
    return [[1, *torch.randint(4, VOCAB, (n,), generator=generator).tolist()] for n in lengths]
