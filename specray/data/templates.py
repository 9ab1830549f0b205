"""The Alpaca prompt templates the paper uses (Ouyang et al., 2024, Appendix B; Taori et al., 2023).

Two variants: one for tasks with an extra "input" field and one without. The prompt ends right after
"### Response:\n"; the model's response is generated from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from specray.data.chat import render_chat, require_chat_template

if TYPE_CHECKING:
    from specray.config import DataSpec
    from specray.data.examples import Example

PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
TEMPLATES = ("alpaca", "chat")


def format_prompt(instruction: str, input: str = "", template: str = "alpaca") -> str:
    """The Alpaca prompt for one example; an empty or whitespace-only `input` selects the no-input variant.
    (`chat` prompts need the model's tokenizer: `prompt_text`.)"""
    if template != "alpaca":
        raise ValueError(f"format_prompt renders the alpaca template, not {template!r} (use prompt_text)")
    if input.strip():
        return PROMPT_WITH_INPUT.format(instruction=instruction, input=input)
    return PROMPT_NO_INPUT.format(instruction=instruction)


def prompt_text(example: Example, template: str, tokenizer: Any = None, earlier: Sequence[str] = ()) -> str:
    """The prompt text of one example: the Alpaca prompt, or (`chat`) through the tokenizer's chat template
    with the generation prompt on — one turn (an `input` follows the instruction after a blank line), or a
    later turn's conversation (`example.turns`) with the model's `earlier` answers. A conversation given
    whole, without answers (a question file as training data), is prompted with its first turn. A chat text
    holds its own special tokens (BOS): encode it without adding them."""
    if template == "alpaca":
        return format_prompt(example.instruction, example.input)
    if template != "chat":
        raise ValueError(f"unknown template {template!r}; valid: {', '.join(TEMPLATES)}")
    if len(example.turns) > 1 and (earlier or example.instruction != example.turns[0]):
        return render_chat(tokenizer, example.turns, earlier)  # a later turn: refused without its answers
    # one turn, or a whole conversation without answers (training data): its first turn, as under alpaca
    turn = f"{example.instruction}\n\n{example.input}" if example.input.strip() else example.instruction
    return render_chat(tokenizer, [turn])


def encode_prompts(
    examples: Sequence[Example],
    tokenizer: Any,
    data: DataSpec,
    answers: Mapping[str, Sequence[str]] | None = None,
) -> list[list[int]]:
    """Token ids of the examples' prompts, cut to `data.max_prompt_tokens` from the left: the end of a
    prompt ("### Response:", a chat's generation prompt) is what the model continues from. The one place
    prompts are encoded: the test sets, the validation prompts of the probe and of Tune agree.

    Under the chat template a later turn of a conversation (`data.spec_bench.expand_turns`) is prompted
    with the turns before it and `answers[its id]`, the model's answers to them (`specdec.turns`); under
    the Alpaca template a conversation is its first turn."""
    if data.template == "chat":
        require_chat_template(tokenizer, str(getattr(tokenizer, "name_or_path", "the target")))
    answers = answers or {}
    texts = [prompt_text(e, data.template, tokenizer, answers.get(e.id, ())) for e in examples]
    special = data.template == "alpaca"  # a chat text writes its own BOS
    encoded = tokenizer(texts, add_special_tokens=special)["input_ids"]
    return [ids[-data.max_prompt_tokens :] for ids in encoded]
