"""Multi-turn test prompts: a later turn is prompted with the conversation so far, the model's own earlier
answers included, as Spec-Bench and MT-bench do.

Every draft must be scored on the same prompts, so the earlier answers are the *target's*, decoded greedily
(τ = 0, `eval.max_new_tokens`) once per test set and cached under a key of what they depend on: the target,
the conversations, the length and the device. Greedy rather than sampled: a conversation then does not
depend on the τ_dec it is scored at, and one set of answers serves the whole grid.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence

from specray.data.chat import encode_chat
from specray.data.examples import Example
from specray.data.spec_bench import conversation_id
from specray.files import cache_dir, write_json
from specray.models.loading import decode_text, load_model, load_tokenizer
from specray.sampling import eos_token_ids, sample_batch

log = logging.getLogger(__name__)
BATCH = 32  # conversations per batched pass, shortest prompts together (less padding)


def later_turns(examples: Iterable[Example]) -> list[Example]:
    """The examples whose prompts need earlier answers (turn 2 on of `data.spec_bench.expand_turns`)."""
    return [e for e in examples if len(e.turns) > 1]


def conversation_answers(
    examples: Sequence[Example], target_path: str, key: str, max_new_tokens: int, device: str = "cpu"
) -> dict[str, tuple[str, ...]]:
    """Per later-turn example id, the target's greedy answers to the turns before it (cached under `key`)."""
    needed = later_turns(examples)
    if not needed:
        return {}
    path = cache_dir() / "conversations" / f"{key}.json"
    if path.exists():
        return {k: tuple(v) for k, v in json.loads(path.read_text()).items()}
    answers = _decode_conversations(needed, target_path, max_new_tokens, device)
    by_turn = {e.id: tuple(answers[conversation_id(e.id)][: len(e.turns) - 1]) for e in needed}
    write_json(path, {k: list(v) for k, v in by_turn.items()})
    return by_turn


def _decode_conversations(
    needed: Sequence[Example], target_path: str, max_new_tokens: int, device: str
) -> dict[str, list[str]]:
    """conversation id -> the target's greedy answers to its turns but the last, decoded turn by turn in
    batches (`sampling.sample_batch`: a row's tokens do not depend on the rows beside it)."""
    import torch

    longest: dict[str, tuple[str, ...]] = {}
    for e in needed:
        if len(e.turns) > len(longest.get(conversation_id(e.id), ())):
            longest[conversation_id(e.id)] = e.turns
    tokenizer, model = load_tokenizer(target_path), load_model(target_path, device=device)
    stops = eos_token_ids(model, tokenizer)
    answers: dict[str, list[str]] = {c: [] for c in longest}
    for k in range(1, max(len(t) for t in longest.values())):
        open_ = [c for c, turns in longest.items() if len(turns) > k]
        log.info("earlier answers: turn %d of %d conversations (target, greedy)", k, len(open_))
        prompts = {c: encode_chat(tokenizer, longest[c][:k], answers[c]) for c in open_}
        order = sorted(open_, key=lambda c: len(prompts[c]))
        for start in range(0, len(order), BATCH):
            rows = order[start : start + BATCH]
            unused = [torch.Generator(device=model.device) for _ in rows]  # greedy: no draws
            samples = sample_batch(
                model,
                [prompts[c] for c in rows],
                [0.0] * len(rows),
                unused,
                max_new_tokens,
                stops,
                tokenizer.pad_token_id,
            )
            for c, sample in zip(rows, samples, strict=True):
                answers[c].append(decode_text(tokenizer, sample.token_ids).strip())
    return answers
