"""The one record every loader produces: an instruction example in Alpaca form."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """An instruction example. `input` is "" when the task has no extra context.

    `family` names where the example came from (a synthetic task family such as "arithmetic",
    a source such as "gsm8k", or a Spec-Bench category), so reports can break results down by it.
    `turns` are the user's turns of a multi-turn conversation (the first is `instruction`), and
    `references` a reference answer per turn ("" where there is none); both empty for a single turn.
    """

    id: str
    instruction: str
    input: str
    output: str
    family: str = ""
    turns: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
