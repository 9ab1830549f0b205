"""A distillation's curve points: what the train loop reports every `distill.report_every` steps.

In the program a point is a `CurvePoint`, its acceptance keyed by τ_dec as a float. Only at the edges
(curves.json, a checkpoint's trainer state, a Ray queue, MLflow, Tune results) is it the flat JSON object
the loop has always written, one key per value: `step`, `loss`, `tokens_per_s`, `seconds_per_step`, `lr`
and per probed τ_dec `acceptance_rate/tau_dec=<τ>`, `per_prompt_tokens/tau_dec=<τ>`,
`per_prompt_beta_sum/tau_dec=<τ>` (τ written with `:g`). `to_json` and `from_json` are the only places
those keys are built and parsed. How a point reads while a distillation runs is here too: `curve_note`
for a driver's display, `curve_line` for `specray distill` on a terminal. This module imports nothing
heavy: the GPU suite reads the probe's points on a bare machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specray.metrics import PER_PROMPT_BETA_SUM, PER_PROMPT_TOKENS

ACCEPTANCE_PREFIX = "acceptance_rate/tau_dec="  # a curve point's key of the probe's acceptance at one τ_dec
TOKENS_PREFIX = f"{PER_PROMPT_TOKENS}/tau_dec="
BETA_SUM_PREFIX = f"{PER_PROMPT_BETA_SUM}/tau_dec="
TRAINING_FIELDS = ("loss", "tokens_per_s", "seconds_per_step", "lr")  # absent at step 0, before training


def acceptance_key(tau_dec: float) -> str:
    """The JSON key (and, sanitised, the MLflow metric) of the probe's acceptance at one τ_dec."""
    return f"{ACCEPTANCE_PREFIX}{tau_dec:g}"


@dataclass(frozen=True)
class PromptSums:
    """The probe's per-prompt values at one τ_dec, in the probe prompts' order: response tokens and β sums,
    which α pools and the report's paired bootstrap over prompts resamples."""

    tokens: tuple[int, ...]
    beta_sums: tuple[float, ...]


@dataclass(frozen=True)
class CurvePoint:
    """One report of the train loop: the window's training figures (None at step 0, the un-distilled
    draft) and the probe's acceptance α per τ_dec (empty where no probe ran, e.g. ranks other than 0)."""

    step: int
    loss: float | None = None
    tokens_per_s: float | None = None
    seconds_per_step: float | None = None
    lr: float | None = None
    acceptance: Mapping[float, float] = field(default_factory=dict)
    per_prompt: Mapping[float, PromptSums] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The flat JSON object, keys in the order the loop has always written them."""
        out: dict[str, Any] = {"step": self.step}
        out |= {name: getattr(self, name) for name in TRAINING_FIELDS if getattr(self, name) is not None}
        for tau in [*self.acceptance, *(t for t in self.per_prompt if t not in self.acceptance)]:
            if tau in self.acceptance:
                out[acceptance_key(tau)] = self.acceptance[tau]
            if (sums := self.per_prompt.get(tau)) is not None:
                out[f"{TOKENS_PREFIX}{tau:g}"] = list(sums.tokens)
                out[f"{BETA_SUM_PREFIX}{tau:g}"] = list(sums.beta_sums)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CurvePoint:
        """Read a flat JSON object (curves.json, a checkpoint, MLflow's records); an unknown key fails."""
        training: dict[str, float] = {}
        acceptance: dict[float, float] = {}
        tokens: dict[float, tuple[int, ...]] = {}
        sums: dict[float, tuple[float, ...]] = {}
        for key, value in data.items():
            if key in TRAINING_FIELDS:
                training[key] = float(value)
            elif key.startswith(ACCEPTANCE_PREFIX):
                acceptance[float(key.removeprefix(ACCEPTANCE_PREFIX))] = float(value)
            elif key.startswith(TOKENS_PREFIX):
                tokens[float(key.removeprefix(TOKENS_PREFIX))] = tuple(int(x) for x in value)
            elif key.startswith(BETA_SUM_PREFIX):
                sums[float(key.removeprefix(BETA_SUM_PREFIX))] = tuple(float(x) for x in value)
            elif key != "step":
                known = ", ".join(
                    ("step", *TRAINING_FIELDS, ACCEPTANCE_PREFIX, TOKENS_PREFIX, BETA_SUM_PREFIX)
                )
                raise ValueError(f"curve point: unknown key {key!r} (known: {known})")
        per_prompt = {tau: PromptSums(tokens[tau], sums[tau]) for tau in tokens if tau in sums}
        loss, tokens_per_s, seconds_per_step, lr = (training.get(name) for name in TRAINING_FIELDS)
        return cls(int(data["step"]), loss, tokens_per_s, seconds_per_step, lr, acceptance, per_prompt)


def curves_to_json(points: Sequence[CurvePoint]) -> list[dict[str, Any]]:
    return [point.to_json() for point in points]


def curves_from_json(rows: Sequence[Mapping[str, Any]]) -> list[CurvePoint]:
    return [CurvePoint.from_json(row) for row in rows]


def curve_note(draft: str, curve: CurvePoint, steps: int, tau_decs: Sequence[float]) -> str:
    """`online/tau_kd=0.6 step 120/200: loss 1.234, acceptance 0.412 (mean over 6 τ_dec)` from a curve
    point of the train loop (the loss is absent at step 0, before training)."""
    parts = [f"loss {curve.loss:.4f}"] if curve.loss is not None else []
    acceptance = [curve.acceptance[float(t)] for t in tau_decs if float(t) in curve.acceptance]
    if acceptance:
        mean = sum(acceptance) / len(acceptance)
        parts.append(f"acceptance {mean:.3f} (mean over {len(acceptance)} τ_dec)")
    return f"{draft} step {curve.step}/{steps}" + (": " + ", ".join(parts) if parts else "")


def curve_line(curve: CurvePoint, tau_decs: Sequence[float]) -> str:
    """`  step 40  loss 1.2345  5210 tokens/s  α@0.6 0.412  α@1 0.388`: one curve point, as reported."""
    parts = [f"step {curve.step}"]
    if curve.loss is not None:
        parts += [f"loss {curve.loss:.4f}", f"{curve.tokens_per_s or 0.0:.0f} tokens/s"]
    parts += [f"α@{t:g} {curve.acceptance[float(t)]:.3f}" for t in tau_decs if float(t) in curve.acceptance]
    return "  " + "  ".join(parts)
