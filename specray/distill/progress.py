"""How a distillation's curve points read while it runs: a note for the sweep's display, a line per point
on a terminal, and the `report` callback of `specray distill`. The generic progress machinery
(`specray.progress`) knows nothing of curves; this module brings the stage's data to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from specray.distill.curves import CurvePoint
from specray.progress import LineMeter, live_display


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


@contextmanager
def curve_progress(
    draft: str, steps: int, tau_decs: Sequence[float]
) -> Iterator[Callable[[CurvePoint], None]]:
    """A `distill(..., report=...)` callback for one draft: on a terminal a line per curve point as it
    arrives; elsewhere a `LineMeter` over the training steps whose lines carry the latest loss and
    acceptance."""
    if live_display():
        yield lambda curve: print(curve_line(curve, tau_decs), flush=True)
        return
    with LineMeter("distill", steps, "step") as meter:

        def report(curve: CurvePoint) -> None:
            meter.set_postfix_str(curve_note(draft, curve, steps, tau_decs))
            meter.set_counts(curve.step, steps)

        yield report
