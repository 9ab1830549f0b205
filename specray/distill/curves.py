"""A distillation's curve points: the keys the train loop reports them under (curves.json, MLflow)."""

from __future__ import annotations

ACCEPTANCE_PREFIX = "acceptance_rate/tau_dec="  # a curve point's key of the probe's acceptance at one τ_dec


def acceptance_key(tau_dec: float) -> str:
    """The curve key of the analytic acceptance at one decoding temperature."""
    return f"{ACCEPTANCE_PREFIX}{tau_dec:g}"
