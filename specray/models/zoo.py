"""The tiny model zoo: a byte-level BPE tokenizer, a tiny Llama target and a much smaller draft.

Everything is trained locally on the synthetic corpus, so the whole pipeline runs on a laptop with no
network. The target sees every task family (in-domain and the out-of-domain word problems) for a few hundred
steps; the draft sees the same ground-truth text for a few dozen steps — it knows the format but not the
target's distribution, which is the gap knowledge distillation closes (llama-68m vs Llama-2 in the paper).

Built zoos are cached under `cache_dir()/zoo/<key>`, where the key hashes the ZooSpec and this file's
format version; a build writes into a temporary folder and renames it, so a killed build leaves no zoo.
Each model is also keyed on its own (`model_key`: the shared recipe and its own shape, not the other
model's) and seeded on its own, so a zoo that changes only the draft copies the target of a cached zoo
instead of pre-training it again (the target is most of a build's time).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import LlamaConfig, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from specray.config import TinyLlamaSpec, ZooSpec
from specray.config.vocabulary import IN_DOMAIN, OUT_OF_DOMAIN
from specray.data.chat import TINY_CHAT_TEMPLATE
from specray.data.splits import fingerprint
from specray.data.synthetic import synthetic_corpus
from specray.data.templates import format_prompt
from specray.files import cache_dir
from specray.locks import producing
from specray.ops.lr_schedule import warmup_cosine
from specray.progress import bar, live_display
from specray.seeds import derive_seed

if TYPE_CHECKING:  # the model class loads where a model is built: naming a zoo (its keys) needs none
    from transformers import LlamaForCausalLM

log = logging.getLogger(__name__)

ZOO_FORMAT = 3  # bump when the build recipe changes, so old caches are not reused
MODEL_FORMAT = 1  # bump when one model's own recipe changes, so that model is rebuilt
MODELS = ("target", "draft")  # every zoo has these two; `ZooSpec.ladder` adds more targets by name
PAD, BOS, EOS = "<pad>", "<s>", "</s>"


def zoo_key(spec: ZooSpec) -> str:
    """Hash of the recipe, the build format and a sample of the corpus (so a changed generator rebuilds)."""
    payload = json.dumps(
        {
            "format": ZOO_FORMAT,
            "spec": spec.model_dump(mode="json"),
            "corpus": _corpus_sample(spec.corpus_seed),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=8)
def _corpus_sample(seed: int) -> str:
    """The fingerprint of the corpus's first 64 examples: a plan names the zoo's models dozens of times."""
    return fingerprint(synthetic_corpus(64, seed, IN_DOMAIN + OUT_OF_DOMAIN))


def zoo_models(spec: ZooSpec) -> tuple[str, ...]:
    """The zoo's models by name: target, draft, then the ladder's."""
    return (*MODELS, *spec.ladder)


def shape_of(spec: ZooSpec, name: str) -> TinyLlamaSpec:
    """The shape of the zoo's model `name` (target, draft or a ladder entry)."""
    if name in MODELS:
        shape: TinyLlamaSpec = getattr(spec, name)
        return shape
    if name not in spec.ladder:
        allowed = ", ".join(zoo_models(spec))
        raise KeyError(f"{name!r} is not a model of the zoo; it has {allowed}")
    return spec.ladder[name]


def model_key(spec: ZooSpec, name: str) -> str:
    """Hash of what one model of the zoo is made from: corpus, tokenizer and pre-training settings, seed
    and its own shape — not the other models' shapes."""
    sample = fingerprint(synthetic_corpus(64, spec.corpus_seed, IN_DOMAIN + OUT_OF_DOMAIN))
    recipe = spec.model_dump(mode="json", exclude={"target", "draft", "ladder"})
    recipe[name if name in MODELS else "shape"] = shape_of(spec, name).model_dump(mode="json")
    payload: dict = {"format": MODEL_FORMAT, "model": name, "spec": recipe, "corpus": sample}
    if name not in MODELS:
        payload["seed"] = _model_seed(spec, name)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _model_seed(spec: ZooSpec, name: str) -> int:
    # each model its own seed, so one model's recipe changing never changes another's weights; a ladder
    # entry's comes from its name, so adding, removing or renaming another entry leaves it as it is
    if name in MODELS:
        return spec.seed if name == "target" else spec.seed + 1
    return derive_seed(spec.seed, "zoo ladder", name)


def find_built_model(root: Path, spec: ZooSpec, name: str) -> Path | None:
    """A built zoo under `root` whose `name` model has this spec's recipe (every zoo.json names its models'
    keys; a zoo of an older build format, without them, is not reused)."""
    wanted = model_key(spec, name)
    for info_file in sorted(root.glob("*/zoo.json")):
        if json.loads(info_file.read_text()).get("model_keys", {}).get(name) == wanted:
            return info_file.parent / name
    return None


@dataclass(frozen=True)
class Zoo:
    """A built zoo on disk. `target` and `draft` are HF model dirs that each include the tokenizer."""

    root: Path
    cached: bool

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def draft(self) -> Path:
        return self.root / "draft"

    def model(self, name: str) -> Path:
        """The folder of the zoo's model `name` (target, draft or a ladder entry)."""
        return self.root / name

    @property
    def info(self) -> dict:
        return json.loads((self.root / "zoo.json").read_text())


def corpus_texts(spec: ZooSpec) -> list[str]:
    """Pre-training documents: prompt + response, over every synthetic family."""
    examples = synthetic_corpus(spec.corpus_size, spec.corpus_seed, IN_DOMAIN + OUT_OF_DOMAIN)
    return [format_prompt(e.instruction, e.input) + e.output for e in examples]


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text encodes; no unknown token) that prepends <s> like Llama's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.chat_template = TINY_CHAT_TEMPLATE  # `data.template: chat` and `specray bench` run on the zoo too
    return fast


def packed_tokens(texts: list[str], tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    """All documents as one stream `<s> doc </s> <s> doc </s> ...` — no padding is wasted in pre-training."""
    ids = tokenizer(texts)["input_ids"]
    stream = [token for doc in ids for token in (*doc, tokenizer.eos_token_id)]
    return torch.tensor(stream, dtype=torch.long)


def llama_config(
    shape: TinyLlamaSpec, vocab_size: int, seq_len: int, tokenizer: PreTrainedTokenizerFast | None = None
) -> LlamaConfig:
    """The Llama configuration of a zoo model of `shape` (its size can be read from it before it is built)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=max(512, 4 * seq_len),  # room for prompt + long generations
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id if tokenizer is not None else None,
        eos_token_id=tokenizer.eos_token_id if tokenizer is not None else None,
        pad_token_id=tokenizer.pad_token_id if tokenizer is not None else None,
    )


def build_model(shape: TinyLlamaSpec, tokenizer: PreTrainedTokenizerFast, seq_len: int) -> LlamaForCausalLM:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(llama_config(shape, len(tokenizer), seq_len, tokenizer))


def pretrain(
    model: LlamaForCausalLM, stream: torch.Tensor, shape: TinyLlamaSpec, spec: ZooSpec, name: str
) -> list[float]:
    """Next-token pre-training on random windows of the packed stream; warm-up then cosine decay."""
    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=shape.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, shape.train_steps // 20)
    schedule = functools.partial(
        warmup_cosine, warmup_steps=warmup, total_steps=shape.train_steps, ramp_steps=warmup
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    losses = []
    # a tqdm bar on a terminal, a line every 5% (and a heartbeat) in a log: `make demo > demo.log`
    with bar(shape.train_steps, f"zoo: pre-train {name}", "step") as meter:
        for _ in range(shape.train_steps):
            starts = torch.randint(0, len(stream) - spec.seq_len - 1, (spec.batch_size,), generator=generator)
            batch = torch.stack([stream[s : s + spec.seq_len] for s in starts.tolist()])  # [batch, seq]
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            meter.set_postfix_str(f"loss {losses[-1]:.3f}")
            meter.update(1)
    model.eval()
    return losses


def _save(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    if not live_display():  # transformers' "Writing model shards" bar redraws with \r: noise in a log
        hf_logging.disable_progress_bar()
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def _build_model(
    spec: ZooSpec, name: str, tokenizer: PreTrainedTokenizerFast, stream: torch.Tensor, folder: Path
) -> dict:
    """Initialise (from the model's own seed), pre-train and save one model; what zoo.json says of it."""
    started = time.perf_counter()
    shape = shape_of(spec, name)
    torch.manual_seed(_model_seed(spec, name))
    model = build_model(shape, tokenizer, spec.seq_len)
    losses = pretrain(model, stream, shape, spec, name)
    _save(model, tokenizer, folder)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "seconds": round(time.perf_counter() - started, 1),
    }


def zoo_dir(spec: ZooSpec, root: Path | None = None) -> Path:
    """The folder the zoo of `spec` is built in (whether or not it is built yet)."""
    return (root or cache_dir() / "zoo") / zoo_key(spec)


def build_zoo(spec: ZooSpec, root: Path | None = None, force: bool = False) -> Zoo:
    """Build (or reuse) the zoo for `spec`; returns where it lives and whether it was a cache hit."""
    final = zoo_dir(spec, root)
    if (final / "zoo.json").exists() and not force:
        return Zoo(final, cached=True)
    with producing([final], "the tiny zoo"):  # another process building it: wait, then reuse its zoo
        if (final / "zoo.json").exists() and not force:
            return Zoo(final, cached=True)
        return _build_zoo(spec, final)


def _build_zoo(spec: ZooSpec, final: Path) -> Zoo:
    started = time.perf_counter()
    texts = corpus_texts(spec)
    tokenizer = train_tokenizer(texts, spec.vocab_size)
    stream = packed_tokens(texts, tokenizer)
    info: dict = {"spec": spec.model_dump(mode="json"), "corpus_tokens": len(stream), "models": {}}
    info["model_keys"] = {name: model_key(spec, name) for name in zoo_models(spec)}
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}-") as tmp:
        for name in zoo_models(spec):
            built = find_built_model(final.parent, spec, name)
            if built is None:
                info["models"][name] = _build_model(spec, name, tokenizer, stream, Path(tmp) / name)
            else:
                shutil.copytree(built, Path(tmp) / name)
                tokenizer.save_pretrained(Path(tmp) / name)  # the same vocabulary; this build's chat template
                reused = json.loads((built.parent / "zoo.json").read_text())["models"][name]
                info["models"][name] = reused | {"copied_from": built.parent.name}
        info["seconds"] = round(time.perf_counter() - started, 1)
        (Path(tmp) / "zoo.json").write_text(json.dumps(info, indent=2))
        if final.exists():  # a forced rebuild replaces the old zoo
            shutil.rmtree(final)
        os.replace(tmp, final)
        Path(tmp).mkdir()  # TemporaryDirectory expects to remove something
    log.info("built zoo %s in %.0fs", final, info["seconds"])
    return Zoo(final, cached=False)


@torch.no_grad()
def sample_responses(
    model_dir: Path, prompts: list[str], tau: float, max_new_tokens: int = 48, seed: int = 0
) -> list[str]:
    """Decode one response per prompt from a zoo model (τ = 0 greedy), for a quick look at its outputs."""
    from transformers import LlamaForCausalLM

    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    responses = []
    for prompt in prompts:
        input_ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        sampling = {"do_sample": True, "temperature": tau, "top_k": 0} if tau > 0 else {"do_sample": False}
        output = model.generate(
            input_ids, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling
        )
        responses.append(tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True))
    return responses
