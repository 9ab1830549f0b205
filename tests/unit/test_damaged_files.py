"""Damaged files in a sweep's folder: a cell record that does not parse is recomputed and the plan says so;
a finished draft whose weights differ from its completion marker is not reused."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from specray.specdec.records import EvalJob
from specray.sweep.survey import UNREADABLE, cell_stage, read_cells


def _job(key: str) -> EvalJob:
    return EvalJob("online/tau_kd=0.6", "/drafts/online", 0.6, "in_domain", "analytic", 3, key=key)


def test_a_truncated_cell_record_is_recomputed_and_the_plan_gives_that_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "cells"
    folder.mkdir()
    (folder / "abc.json").write_text('{"c": 0.71, "draft": "online/tau_kd=0.6", "metr')  # cut mid-write
    with caplog.at_level(logging.WARNING):
        saved = read_cells(folder)
    assert saved == {}
    assert f"abc.json: {UNREADABLE}; its cell is computed again" in caplog.text
    assert "older specray format" not in caplog.text
    stage, todo = cell_stage([_job("abc"), _job("new")], saved, folder)
    assert [job.key for job in todo] == ["abc", "new"]
    assert stage.reasons == Counter({UNREADABLE: 1, "new": 1})
    assert "unreadable (truncated or corrupt)" in stage.line()


def test_a_record_of_another_format_is_named_as_such(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "old.json").write_text('{"draft": "x", "no_such_field": 1}')
    with caplog.at_level(logging.WARNING):
        assert read_cells(tmp_path) == {}
    assert "written by an older specray format" in caplog.text and UNREADABLE not in caplog.text


def test_a_draft_whose_weights_were_cut_short_is_retrained_and_kept_aside(tmp_path: Path) -> None:
    from specray.config import load_spec
    from specray.distill.checkpoints import (
        FinishedDraft,
        is_finished,
        publish,
        read_finished,
        set_aside_damaged,
    )
    from specray.sweep.plan import plan_sweep
    from specray.sweep.survey import draft_stage
    from tests.conftest import REPO

    spec = load_spec(REPO / "sweeps" / "smoke.yaml", [f"output_dir={tmp_path / 'out'}"])
    plan = list(plan_sweep(spec).drafts)[0]
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (checkpoint / "config.json").write_text("{}")
    publish(checkpoint, plan.folder, spec, FinishedDraft(fingerprint=plan.key, key_inputs=plan.key_inputs))
    assert set(read_finished(plan.folder).weights_sha256 or {}) == {"model.safetensors"}
    assert is_finished(plan.folder, plan.key) and draft_stage(spec, [plan])[0].reused == 1

    weights = plan.folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a partial copy
    assert not is_finished(plan.folder, plan.key)
    stage, todo = draft_stage(spec, [plan])
    assert todo == [plan] and stage.reasons == Counter({"retrain (weights differ from finished.json)": 1})

    aside = set_aside_damaged(plan.folder)
    assert aside is not None and aside.name.startswith(f"{plan.folder.name}.damaged-")
    assert not plan.folder.exists() and (aside / "model.safetensors").stat().st_size == 1000
    assert set_aside_damaged(plan.folder) is None  # nothing left to set aside
