"""What a user sees when a sweep's folder holds results of an older specray format (`keys.FORMAT_VERSION`):
one line naming the folder and saying it is recomputed, and the work done again — never a traceback, and
never a record read with the fields its older writer lacked guessed."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest

from specray.config import load_spec
from specray.distill.checkpoints import FINISHED_FILE, FinishedDraft, is_finished, publish, set_aside_damaged
from specray.errors import SpecError
from specray.keys import FORMAT_VERSION
from specray.specdec.records import CellRecord, EvalJob
from specray.sweep.plan import plan_sweep
from specray.sweep.survey import OLDER_FORMAT, cell_stage, draft_stage, read_cells
from tests.conftest import REPO

OLDER = "written by an older specray format"


def _record(key: str) -> CellRecord:
    job = EvalJob("offline/tau_kd=1", "/drafts/offline", 1.0, "in_domain", "analytic", 3, key=key)
    return CellRecord.of(job, 0.2, 1.0, {"acceptance_rate": 0.5})


def test_cell_records_of_an_older_format_are_recomputed_with_one_line_for_their_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "cells"
    folder.mkdir()
    current = _record("new")
    (folder / "new.json").write_text(json.dumps(current.to_json()))
    for key in ("old1", "old2"):  # as the code before the bump wrote them: no format, no batch size
        payload = {k: v for k, v in asdict(_record(key)).items() if k != "batch_size"}
        (folder / f"{key}.json").write_text(json.dumps(payload))
    with caplog.at_level(logging.WARNING):
        saved = read_cells(folder)
    assert saved == {"new": current}
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"{folder}: {OLDER} (this one writes format {FORMAT_VERSION}); "
        "its 2 cell records are not read; recomputed"
    ]
    jobs = [
        EvalJob("offline/tau_kd=1", "/drafts/offline", 1.0, "in_domain", "analytic", 3, key=k)
        for k in ("old1", "new")
    ]
    _, todo = cell_stage(jobs, saved)
    assert [job.key for job in todo] == ["old1"]


def test_a_draft_finished_under_an_older_format_is_trained_again_and_the_plan_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = load_spec(REPO / "sweeps" / "smoke.yaml", [f"output_dir={tmp_path / 'out'}"])
    draft = list(plan_sweep(spec).drafts)[0]
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    publish(checkpoint, draft.folder, spec, FinishedDraft(fingerprint=draft.key, key_inputs=draft.key_inputs))
    assert is_finished(draft.folder, draft.key) and draft_stage(spec, [draft])[0].reused == 1
    # the same draft's marker as the code before the bump wrote it: its key, but no format
    marker = json.loads((draft.folder / FINISHED_FILE).read_text())
    del marker["format"]
    (draft.folder / FINISHED_FILE).write_text(json.dumps(marker))
    with caplog.at_level(logging.WARNING):
        stage, todo = draft_stage(spec, [draft])
    assert todo == [draft] and stage.reasons == Counter({OLDER_FORMAT: 1})
    assert [r.getMessage() for r in caplog.records] == [
        f"{draft.folder}: {OLDER} (this one writes format {FORMAT_VERSION}); trained again"
    ]
    assert not is_finished(draft.folder, draft.key)  # the trainer replaces it
    assert set_aside_damaged(draft.folder) is None and draft.folder.is_dir()  # not damaged: not set aside


def test_a_tune_whose_draft_records_are_of_an_older_format_is_refused_in_one_line(tmp_path: Path) -> None:
    from specray.names import TUNE_DRAFTS
    from specray.serving.tune_source import tune_drafts

    report = tmp_path / "report"
    report.mkdir()
    old = {"name": "offline/tau_kd=1", "paradigm": "offline", "mixture": "1:1", "key": "k"}  # the tag form
    (report / TUNE_DRAFTS).write_text(json.dumps({"drafts": [old]}))
    with pytest.raises(SpecError) as refused:
        tune_drafts(report)
    assert str(refused.value) == (
        f"{report}: {OLDER} (this one writes format {FORMAT_VERSION}); run the tune again to recompute it"
    )
