"""The batched, KV-cached sampler every part of specray decodes with: the teacher's transformers engine,
the distillation loop's on-policy samples, the analytic estimator's target continuations and the lossy
estimator's lockstep decoding. Torch only (no config, no model loading), imported lazily so that a module
importing it (the engines) loads no torch until it samples.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sample:
    token_ids: list[int]
    finish_reason: FinishReason
    # the raw logits each token was drawn from, [len(token_ids), vocab], when asked for (keep_logits)
    logits: torch.Tensor | None = None


def left_pad(
    sequences: Sequence[Sequence[int]], pad_token_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and mask, so every row's last prompt token sits in the last column.

    -> (input_ids [batch, max_len] int64, attention_mask [batch, max_len] int64 with 0 on padding).
    """
    import torch

    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):
        if ids:
            input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def _next_token(logits: torch.Tensor, tau: float, generator: torch.Generator) -> int:
    """One token from `logits` [vocab]: argmax at τ = 0 (the generator is untouched), else a draw from
    softmax(logits / τ) with this request's generator."""
    from specray.ops.warp import sample, warp

    if tau == 0.0:
        return int(logits.argmax())
    return int(sample(warp(logits, tau), generator))


def sample_batch(
    model: PreTrainedModel,
    prompts_token_ids: Sequence[Sequence[int]],
    taus: Sequence[float],
    generators: Sequence[torch.Generator],
    max_new_tokens: int | Sequence[int],
    eos_token_ids: Collection[int],
    pad_token_id: int,
    keep_logits: bool = False,
    copies: int = 1,
) -> list[Sample]:
    """Sample one continuation per prompt with a KV cache; row i uses `taus[i]` and `generators[i]`.

    Prompts are left-padded and positions count only real tokens, so a row's logits do not depend on
    the other rows. A row stops at an EOS id (kept as its last token, reason "stop") or after its
    `max_new_tokens` (reason "length"); finished rows leave the batch (their KV cache rows are dropped),
    so the remaining steps only pay for the rows still running. `keep_logits` also returns, per row, the
    logits each token was drawn from (the analytic estimator uses them as the target's pass).
    `copies` > 1 samples every prompt that many times — rows prompt-major (row i·copies + k is copy k of
    prompt i; `taus`, `generators` and a list of `max_new_tokens` are given per row) — and runs each prompt
    through the model once, its cache then shared by its copies (`decode_lockstep`).
    Runs under no_grad; put a model that is being trained in eval mode first (dropout).
    """
    import torch

    count = len(prompts_token_ids) * copies
    limits = [max_new_tokens] * count if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if not (len(taus) == len(generators) == len(limits) == count):
        raise ValueError(
            "prompts_token_ids (x copies), taus, generators and max_new_tokens must have the same length"
        )
    rows = [
        _Row(tau, generator, limit) for tau, generator, limit in zip(taus, generators, limits, strict=True)
    ]
    kept: list[list[torch.Tensor]] = [[] for _ in rows]

    def choose(logits: list[torch.Tensor], running: list[int]) -> list[int]:
        next_ids = []
        for i, index in enumerate(running):
            next_ids.append(rows[index].step(logits[0][i], eos_token_ids, pad_token_id))
            if keep_logits:
                kept[index].append(logits[0][i].float().cpu())
        return next_ids

    def finished(index: int) -> bool:
        return rows[index].finish_reason is not None

    decode_lockstep([model], prompts_token_ids, pad_token_id, choose, finished, copies)
    return [
        Sample(row.tokens, row.finish_reason, torch.stack(kept[i]) if keep_logits else None)  # type: ignore[arg-type]
        for i, row in enumerate(rows)
    ]


def decode_lockstep(
    models: Sequence[PreTrainedModel],
    prompts_token_ids: Sequence[Sequence[int]],
    pad_token_id: int,
    choose: Callable[[list[torch.Tensor], list[int]], list[int]],
    finished: Callable[[int], bool],
    copies: int = 1,
) -> None:
    """The KV-cached decoding loop behind every sampler here, for one model or several in lockstep.

    Each model prefills the prompts (a common prefix once, `_prefill_shared_prefix`). Then, until no row
    is left: every model runs on the running rows' last token, `choose(logits, running)` gets logits[k]
    [running, vocab] of model k and the running rows' indices (batch order) and returns each running row's
    next token, and the rows for which `finished(index)` now holds leave the batch and every cache, so
    later steps pay only for the rows still going. With `copies` > 1 each prompt is `copies` rows (row
    i·copies + k), which share the prompt's prefill: its cache and first logits are repeated after it.
    The models must share a tokenizer; runs under no_grad.
    """
    import torch

    device = next(models[0].parameters()).device
    with torch.no_grad():
        caches, logits = [], []
        for model in models:
            cache, input_ids, attention_mask, position_ids = _prefill_shared_prefix(
                model, prompts_token_ids, pad_token_id, device
            )
            out = _forward(model, cache, input_ids, attention_mask, position_ids)
            caches.append(out.past_key_values)
            logits.append(out.logits[:, -1, :])  # [prompts, vocab]
        if copies > 1:  # every copy continues from its prompt's cache
            for cache in caches:
                cache.batch_repeat_interleave(copies)
            logits = [x.repeat_interleave(copies, dim=0) for x in logits]
            attention_mask = attention_mask.repeat_interleave(copies, dim=0)
            position_ids = position_ids.repeat_interleave(copies, dim=0)
        running = list(range(len(prompts_token_ids) * copies))
        while running:
            next_ids = choose(logits, running)
            still = [i for i, index in enumerate(running) if not finished(index)]
            if not still:
                return
            if len(still) < len(running):  # drop finished rows from the batch and the caches
                select = torch.tensor(still, device=device, dtype=torch.long)
                for cache in caches:
                    cache.batch_select_indices(select)
                attention_mask, position_ids = attention_mask[select], position_ids[select]
                next_ids = [next_ids[i] for i in still]
                running = [running[i] for i in still]
            input_ids = torch.tensor(next_ids, device=device, dtype=torch.long)[:, None]  # [running, 1]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(running), 1))], dim=-1)
            position_ids = position_ids[:, -1:] + 1
            logits = []
            for k, model in enumerate(models):
                out = _forward(model, caches[k], input_ids, attention_mask, position_ids)
                caches[k] = out.past_key_values
                logits.append(out.logits[:, -1, :])  # [running, vocab]


def _forward(
    model: PreTrainedModel,
    cache: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
) -> Any:
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,  # only the last position is needed: skips the prompt's vocab projection
    )


SHARED_PREFIX_MIN = 4  # shorter common prefixes are not worth a separate forward pass


def _prefill_shared_prefix(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the prompts' common prefix (e.g. a prompt template) once and share its KV cache.

    Returns (cache or None, input_ids, attention_mask, position_ids) for the first batched step: the rows
    are laid out as [prefix | left padding | rest of the prompt], the mask covers the whole row and
    positions count only real tokens, so every row's logits equal those of its unpadded prompt. Without a
    common prefix of at least SHARED_PREFIX_MIN tokens this is plain left padding and no cache. Every row
    keeps at least one token after the prefix, so its last prompt token sits in the last column.
    """
    import torch

    shortest = min(len(p) for p in prompts)
    shared = 0
    while shared < shortest - 1 and len({p[shared] for p in prompts}) == 1:
        shared += 1
    if shared < SHARED_PREFIX_MIN or len(prompts) == 1:
        input_ids, attention_mask = left_pad(prompts, pad_token_id, device)  # [batch, prompt]
        return None, input_ids, attention_mask, (attention_mask.cumsum(-1) - 1).clamp(min=0)
    prefix = torch.tensor([list(prompts[0][:shared])], dtype=torch.long, device=device)
    cache = model(input_ids=prefix, use_cache=True, logits_to_keep=1).past_key_values
    cache.batch_repeat_interleave(len(prompts))
    input_ids, rest_mask = left_pad([p[shared:] for p in prompts], pad_token_id, device)
    attention_mask = torch.cat([rest_mask.new_ones((len(prompts), shared)), rest_mask], dim=-1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
    return cache, input_ids, attention_mask, position_ids


@dataclass
class _Row:
    """One sequence of a batch being decoded."""

    tau: float
    generator: torch.Generator
    limit: int
    tokens: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    def step(self, logits: torch.Tensor, eos_token_ids: Collection[int], pad_token_id: int) -> int:
        """Append the next token (if still running); returns the id to feed at the next position."""
        if self.finish_reason is not None:
            return pad_token_id
        token = _next_token(logits, self.tau, self.generator)
        self.tokens.append(token)
        if token in eos_token_ids:
            self.finish_reason = "stop"
        elif len(self.tokens) >= self.limit:
            self.finish_reason = "length"
        return token


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's generation config EOS(s)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    return ids
