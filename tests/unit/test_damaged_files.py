"""Damaged files in a sweep's folder: a cell record that does not parse is recomputed and the plan says so;
a finished draft whose weights differ from its completion marker is not reused."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from specray.specdec.records import EvalJob
from specray.sweep.plan import UNREADABLE, cell_stage, read_cells


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
    assert "not a cell record of this specray version" not in caplog.text
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
    assert "not a cell record of this specray version" in caplog.text and UNREADABLE not in caplog.text
