"""A cheap acceptance estimate while distilling: the analytic estimator on a few validation prompts, every
τ_dec of a report in one pass of the draft.

The quantity is the eval's analytic one (`specdec/analytic.py`, Leviathan et al. Cor. 3.6): along target
continuations y ~ p_τ, β_t = Σ_v min(p_τ(v), q_τ(v)) at every response position, pooled over tokens into α.
The numbers form the acceptance-vs-KD-steps curve (paper Figure 6), the convergence check
(`convergence.py`) and the signal Tune's early stopping reads.

Paid once, when the probe is built: the target is fixed while the draft trains, so its continuations at
every τ_dec and its distributions along them never change. They come from one `sample_batch` call for all
τ_dec (each prompt prefilled once, its cache shared by its τ_dec copies); the distributions are the logits
the tokens were drawn from, warped, kept at the response positions only.

Paid at each report: one pass of the draft over what is new — the prompts once, in one batch, then every
τ_dec's responses over the prompts' caches in batches of similar length — and β at the response positions
only, no padding through the vocabulary. The road not taken is what the probe was, an `AnalyticEstimator`
per τ_dec: 8 target sampling calls at build time, then at each report 8 passes of the draft over prompt +
response padded to each batch's longest, with per-position extras the curve never reads (the sampled
tokens' acceptance, the target's entropy) — 3 to 5 times the cost (benchmarks/README.md). The figures are
the estimator's up to fp round-off (tests/unit/test_distill_probe.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specray.data.templates import encode_prompts
from specray.distill.curves import PromptSums
from specray.ops import token_acceptance, warp
from specray.sampling import Sample, left_pad, sample_batch
from specray.seeds import prompt_seed

if TYPE_CHECKING:  # the probe itself runs without the config (the GPU test suite has no pydantic)
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from specray.config import DataSpec
    from specray.data.examples import Example

PROBE_PROMPTS = 16  # enough for a trend, cheap enough to run every few steps
DRAFT_BATCH = 32  # responses per forward pass of the draft: sorted by length, so a batch pads little


def probe_prompts(
    validation: Sequence[Example], tokenizer: PreTrainedTokenizerBase, data: DataSpec
) -> list[list[int]]:
    """Token ids of the first PROBE_PROMPTS validation prompts, encoded like the test prompts."""
    return encode_prompts(list(validation[:PROBE_PROMPTS]), tokenizer, data)


@dataclass(frozen=True)
class _Responses:
    """Target responses of similar length, as one forward pass of the draft over the prompts' caches takes
    them: each row is the response but its last token (the last token predicts nothing scored)."""

    prompt: Tensor  # [rows]: each row's prompt, an index into the probe's prompts
    input_ids: Tensor  # [rows, span], right-padded
    attention_mask: Tensor  # [rows, span]
    position_ids: Tensor  # [rows, span]: each row's positions after its own prompt
    scored: Tensor  # [rows, 1 + span] bool: column t predicts response token t (column 0: the prompt's last)


@dataclass(frozen=True)
class _TargetSide:
    """What the probe keeps of the target, fixed while a draft trains: per (τ_dec, prompt) the response's
    length, the draft's pass (prompts left-padded, then the responses in batches), and per τ_dec the
    target's p_τ at each response position."""

    taus: list[float]
    tokens: Tensor  # [τ, prompt]: response tokens
    prompt_ids: Tensor  # [prompts, width]: left-padded
    prompt_mask: Tensor  # [prompts, width]
    batches: list[_Responses]  # every (τ, prompt) with a response, shortest first
    owner: Tensor  # [positions]: each response position's flat (τ, prompt) index, in the pass's order
    by_tau: list[tuple[Tensor, Tensor]]  # per τ: its positions in the pass's order, p_τ there [n, vocab]


class AcceptanceProbe:
    """The target's continuations and distributions at each τ_dec, held in memory; scores any draft."""

    def __init__(
        self,
        target: PreTrainedModel,
        prompts: list[list[int]],
        taus_dec: Sequence[float],
        max_new_tokens: int,
        eos_token_id: int | None,
        pad_token_id: int,
        seed: int = 0,
    ) -> None:
        settings = ([float(tau) for tau in taus_dec], max_new_tokens, eos_token_id, pad_token_id, seed)
        key = (_fingerprint(target), tuple(map(tuple, prompts)), *map(repr, settings))
        if key not in _BUILT:  # one process often trains several drafts against one target (Ray Train runs)
            _BUILT.clear()  # keep one: a long-lived process must not pile up targets' distributions
            _BUILT[key] = _target_side(target, prompts, *settings)
        self.target = _BUILT[key]

    @torch.no_grad()
    def __call__(self, draft: PreTrainedModel) -> tuple[dict[float, float], dict[float, PromptSums]]:
        """Per τ_dec the acceptance α and the per-prompt response tokens and β sums it pools (in the probe
        prompts' order, what the report's paired bootstrap over prompts resamples); the draft is put in
        eval mode and restored afterwards."""
        was_training = draft.training
        draft.eval()
        try:
            logits = self._draft_logits(draft)  # [positions, vocab]
        finally:
            draft.train(was_training)
        side = self.target
        beta = torch.zeros(len(side.owner), dtype=torch.float64)  # [positions]
        for tau, (at, target_probs) in zip(side.taus, side.by_tau, strict=True):
            if len(at):
                scored = token_acceptance(target_probs, warp(logits[at.to(logits.device)], tau))
                beta[at] = scored.double().cpu()
        sums = torch.zeros(side.tokens.numel(), dtype=torch.float64).index_add_(0, side.owner, beta)
        sums = sums.view(side.tokens.shape)  # [τ, prompt]
        acceptance, per_prompt = {}, {}
        for k, tau in enumerate(side.taus):
            total = int(side.tokens[k].sum())
            acceptance[tau] = float(sums[k].sum() / total) if total else float("nan")
            rounded = tuple(round(x, 6) for x in sums[k].tolist())
            per_prompt[tau] = PromptSums(tuple(side.tokens[k].tolist()), rounded)
        return acceptance, per_prompt

    def _draft_logits(self, draft: PreTrainedModel) -> Tensor:
        """The draft's logits at every response position, in the pass's order: [positions, vocab]. Its
        prompts run once (left-padded, one batch); each batch of responses runs over their caches."""
        from transformers import DynamicCache

        device, side = next(draft.parameters()).device, self.target
        prompt_mask = side.prompt_mask.to(device)
        out = draft(
            input_ids=side.prompt_ids.to(device),
            attention_mask=prompt_mask,
            position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,  # the last prompt position predicts each response's first token
        )
        first = out.logits[:, -1]  # [prompts, vocab]
        layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        found = []
        for batch in side.batches:
            rows = batch.prompt.to(device)
            logits = first[rows][:, None]  # [rows, 1, vocab]
            if batch.input_ids.shape[1]:
                past = DynamicCache(
                    [(keys[rows], values[rows]) for keys, values in layers], config=draft.config
                )
                out = draft(
                    input_ids=batch.input_ids.to(device),
                    attention_mask=torch.cat([prompt_mask[rows], batch.attention_mask.to(device)], dim=1),
                    position_ids=batch.position_ids.to(device),
                    past_key_values=past,
                    use_cache=True,
                )
                logits = torch.cat([logits, out.logits], dim=1)  # [rows, 1 + span, vocab]
            found.append(logits[batch.scored.to(device)])
        return torch.cat(found)


_BUILT: dict[tuple, _TargetSide] = {}  # the last target side this process built, by what it was built from


def _fingerprint(model: PreTrainedModel) -> tuple:
    """Which model this is, cheaply: its path, dtype, device and each parameter tensor's sum (a model
    trained again at the same path has other sums)."""
    sums = torch.stack([p.detach().float().sum() for p in model.parameters()]).tolist()
    return (model.name_or_path, str(model.dtype), str(model.device), *sums)


def _target_side(
    target: PreTrainedModel,
    prompts: list[list[int]],
    taus: list[float],
    max_new_tokens: int,
    eos_token_id: int | None,
    pad_token_id: int,
    seed: int,
) -> _TargetSide:
    samples = _continuations(target, prompts, taus, max_new_tokens, eos_token_id, seed, pad_token_id)
    tokens = torch.tensor([[len(s.token_ids) for s in at_tau] for at_tau in samples])  # [τ, prompt]
    # every (τ, prompt) with a response, shortest first: the draft's pass runs them in this order
    rows = sorted(((k, i) for k, i in tokens.nonzero().tolist()), key=lambda row: int(tokens[row[0], row[1]]))
    batches = [
        _responses([samples[k][i].token_ids for k, i in chunk], [i for _, i in chunk], prompts, pad_token_id)
        for chunk in (rows[start : start + DRAFT_BATCH] for start in range(0, len(rows), DRAFT_BATCH))
    ]
    owner = torch.tensor([k * len(prompts) + i for k, i in rows for _ in range(int(tokens[k, i]))])
    probs = [warp(samples[k][i].logits, taus[k]) for k, i in rows]  # logits kept: keep_logits
    stacked = torch.cat(probs) if probs else torch.zeros(0, 0)  # [positions, vocab]
    at_tau = [(owner // len(prompts) == k).nonzero().flatten() for k in range(len(taus))]
    by_tau = [(at, stacked[at].to(target.device)) for at in at_tau]
    prompt_ids, prompt_mask = left_pad(prompts, pad_token_id)
    return _TargetSide(taus, tokens, prompt_ids, prompt_mask, batches, owner.long(), by_tau)


def _responses(
    responses: list[list[int]], prompt: list[int], prompts: list[list[int]], pad_token_id: int
) -> _Responses:
    """One batch of the draft's pass: `responses[j]` follows `prompts[prompt[j]]`."""
    span = max(len(r) for r in responses) - 1
    input_ids = torch.full((len(responses), span), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(responses), span), dtype=torch.long)
    scored = torch.zeros((len(responses), 1 + span), dtype=torch.bool)
    for j, response in enumerate(responses):
        input_ids[j, : len(response) - 1] = torch.tensor(response[:-1], dtype=torch.long)
        attention_mask[j, : len(response) - 1] = 1
        scored[j, : len(response)] = True
    lengths = torch.tensor([len(prompts[i]) for i in prompt])
    position_ids = lengths[:, None] + torch.arange(span)[None, :]
    return _Responses(torch.tensor(prompt), input_ids, attention_mask, position_ids, scored)


def _continuations(
    target: PreTrainedModel,
    prompts: list[list[int]],
    taus: list[float],
    max_new_tokens: int,
    eos_token_id: int | None,
    seed: int,
    pad_token_id: int,
) -> list[list[Sample]]:
    """[τ][prompt]: one target sample per prompt and τ, with the logits it was drawn from; prompt i draws
    from its own generator seeded by (seed, i) at every τ, as the eval's `sample_continuations` does. One
    `sample_batch` call: each prompt prefilled once, its cache shared by its τ copies."""
    generators = [
        torch.Generator(device=target.device).manual_seed(prompt_seed(seed, i))
        for i in range(len(prompts))
        for _ in taus
    ]
    eos = {eos_token_id} if eos_token_id is not None else set()
    samples = sample_batch(
        target,
        prompts,
        taus * len(prompts),
        generators,
        max_new_tokens,
        eos,
        pad_token_id,
        keep_logits=True,
        copies=len(taus),
    )
    return [samples[k :: len(taus)] for k in range(len(taus))]
