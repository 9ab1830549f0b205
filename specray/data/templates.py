"""The Alpaca prompt templates the paper uses (Ouyang et al., 2024, Appendix B; Taori et al., 2023).

Two variants: one for tasks with an extra "input" field and one without. The prompt ends right after
"### Response:\n"; the model's response is generated from there.
"""

from __future__ import annotations

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
