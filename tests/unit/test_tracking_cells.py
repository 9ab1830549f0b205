"""The MLflow metrics of one cell record: specray's own and what servers report, one per draft position."""

from __future__ import annotations

import math

from specray.specdec.records import CellRecord
from specray.tracking.names import cell_metrics


def record(estimator: str, **metrics) -> CellRecord:
    return CellRecord("d", "k", "in_domain", 0.6, estimator, 3, "key", 0.1, 1.0, metrics)


def test_analytic_cells_log_the_server_metrics_per_position() -> None:
    metrics = cell_metrics(
        record(
            "analytic",
            acceptance_rate=0.7,
            mean_acceptance_length=2.5,
            draft_acceptance=0.5,
            acceptance_per_position=[0.8, 0.5, math.nan],
            beta_per_position=[0.9, 0.8],  # not a metric
        )
    )
    assert metrics == {
        "acceptance_rate/in_domain/tau_dec_0.6": 0.7,
        "mean_acceptance_length/in_domain/tau_dec_0.6": 2.5,
        "draft_acceptance_model/in_domain/tau_dec_0.6": 0.5,
        "acceptance_per_position/in_domain/tau_dec_0.6/position_1": 0.8,
        "acceptance_per_position/in_domain/tau_dec_0.6/position_2": 0.5,
    }


def test_empirical_cells_keep_their_names_and_gain_the_server_metrics() -> None:
    metrics = cell_metrics(
        record("empirical", draft_acceptance=0.4, mean_acceptance_length=1.9, acceptance_per_position=[0.6]),
        with_gamma=True,
    )
    assert metrics == {
        "draft_acceptance/in_domain/tau_dec_0.6/gamma_3": 0.4,
        "empirical_mean_acceptance_length/in_domain/tau_dec_0.6/gamma_3": 1.9,
        "empirical_acceptance_per_position/in_domain/tau_dec_0.6/gamma_3/position_1": 0.6,
    }
