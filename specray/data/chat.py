"""Prompts through a model's own chat template: the user's turns and the model's earlier answers, rendered by
the tokenizer's `apply_chat_template` with the generation prompt on, as a chat model is served.

The tiny zoo's tokenizer carries `TINY_CHAT_TEMPLATE`: a one-turn conversation renders exactly as the
no-input Alpaca prompt the zoo was pre-trained on (so its models answer sensibly), and a later turn appends
"### Instruction:" / "### Response:" blocks after the earlier answers, each answer closed by EOS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specray.errors import ModelError

TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "### Instruction:\n{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'assistant' %}"
    "### Response:\n{{ message['content'] }}{{ eos_token }}\n\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}### Response:\n{% endif %}"
)


def require_chat_template(tokenizer: Any, model: str) -> None:
    """Refuse a tokenizer without a chat template, naming the model."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError(
            f"{model}: its tokenizer has no chat template, so prompts cannot be rendered as chats; "
            "use a chat model, set the tokenizer's chat_template, or use the alpaca template"
        )


def conversation(turns: Sequence[str], answers: Sequence[str] = ()) -> list[dict[str, str]]:
    """Chat messages for the last of `turns`: every earlier turn followed by its answer."""
    if len(answers) != len(turns) - 1:
        raise ValueError(f"{len(turns)} turns need {len(turns) - 1} earlier answers, got {len(answers)}")
    messages = []
    for k, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if k < len(answers):
            messages.append({"role": "assistant", "content": answers[k]})
    return messages


def render_chat(tokenizer: Any, turns: Sequence[str], answers: Sequence[str] = ()) -> str:
    """The prompt text of the last turn, the generation prompt included."""
    text = tokenizer.apply_chat_template(
        conversation(turns, answers), tokenize=False, add_generation_prompt=True
    )
    return str(text)


def encode_chat(tokenizer: Any, turns: Sequence[str], answers: Sequence[str] = ()) -> list[int]:
    """Token ids of `render_chat`'s text; the template writes its own special tokens (BOS), so the
    tokenizer adds none."""
    return list(tokenizer(render_chat(tokenizer, turns, answers), add_special_tokens=False)["input_ids"])
