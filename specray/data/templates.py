"""The Alpaca prompt templates the paper uses (Ouyang et al., 2024, Appendix B; Taori et al., 2023).

Two variants: one for tasks with an extra "input" field and one without. The prompt ends right after
"### Response:\n"; the model's response is generated from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
TEMPLATES = ("alpaca",)


def format_prompt(instruction: str, input: str = "", template: str = "alpaca") -> str:
    """The prompt for one example; an empty or whitespace-only `input` selects the no-input variant."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; valid: {', '.join(TEMPLATES)}")
    if input.strip():
        return PROMPT_WITH_INPUT.format(instruction=instruction, input=input)
    return PROMPT_NO_INPUT.format(instruction=instruction)


def encode_prompts(examples: Sequence[Example], tokenizer: Any, data: DataSpec) -> list[list[int]]:
    """Token ids of the examples' prompts, cut to `data.max_prompt_tokens` from the left: the end of an
    Alpaca prompt, "### Response:", is what the model continues from. The one place prompts are encoded:
    the test sets, the validation prompts of the probe and of Tune, and the training rows agree."""
    texts = [format_prompt(e.instruction, e.input, data.template) for e in examples]
    return [ids[-data.max_prompt_tokens :] for ids in tokenizer(texts)["input_ids"]]
