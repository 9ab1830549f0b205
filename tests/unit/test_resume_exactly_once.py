"""Regressions the chaos run (benchmarks/chaos.py) found: a sweep resumed after a fault must end as the
fault-free one does, each result once."""

from __future__ import annotations

import json
from pathlib import Path

from specray.files import write_json
from specray.specdec.records import CellRecord


def test_a_cell_record_read_back_gives_the_same_report_row_as_when_it_was_evaluated(tmp_path: Path) -> None:
    """A resumed run reads its cells back from disk, where their dict figures have sorted keys; the report's
    cells.csv printed those dicts in another order than the fault-free run's."""
    metrics = {
        "cost_terms": {"target_step": 1.0, "per_drafted_token": 0.5, "prefill_target": 0.0},
        "speedup_model_by_batch": {"4": 2.0, "1": 1.4},
        "acceptance_rate": 0.9,
    }
    record = CellRecord("d", "K", "in_domain", 1.0, "analytic", 3, "key", 0.5, 0.1, metrics)
    write_json(tmp_path / "key.json", record.to_json(), indent=None)  # as the stage runner saves it
    back = CellRecord.from_json(json.loads((tmp_path / "key.json").read_text()))
    assert str(back.flat()) == str(record.flat())
