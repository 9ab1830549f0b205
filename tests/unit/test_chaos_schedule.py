"""The chaos supervisor's fault schedule (benchmarks/chaos/schedule.py): a seed reproduces it, and it keeps
inside what the sweep promises to survive."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.chaos.run import COUNTS, MAX_DELAY_S
from benchmarks.chaos.schedule import MAX_POOL_FAULTS, PHASES, RESTARTS, STAGE, WHERE, draw_schedule
from tests.conftest import REPO


@pytest.mark.parametrize("mode", ["quick", "long"])
def test_a_seed_reproduces_its_schedule_and_another_seed_draws_another(mode: str) -> None:
    first = draw_schedule(7, COUNTS[mode], MAX_DELAY_S[mode])
    assert draw_schedule(7, COUNTS[mode], MAX_DELAY_S[mode]) == first
    assert draw_schedule(8, COUNTS[mode], MAX_DELAY_S[mode]) != first


def test_the_script_prints_the_same_schedule_for_the_same_seed() -> None:
    """What a user compares: two invocations of `benchmarks.chaos.run --schedule-only` (fresh interpreters,
    so nothing like a hash seed can differ unnoticed)."""
    command = [sys.executable, "-m", "benchmarks.chaos.run", "--seed", "3", "--schedule-only"]
    runs = [
        subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout for _ in range(2)
    ]
    assert runs[0] == runs[1] and runs[0].count(" after ") == sum(COUNTS["long"].values())


@pytest.mark.parametrize("seed", range(50))
def test_the_long_schedule_has_every_kind_in_its_phases_and_no_more_pool_faults_than_a_pool_survives(
    seed: int,
) -> None:
    schedule = draw_schedule(seed, COUNTS["long"], MAX_DELAY_S["long"])
    assert len(schedule) >= 30
    assert {kind: sum(f.kind == kind for f in schedule) for kind in COUNTS["long"]} == COUNTS["long"]
    assert min(COUNTS["long"].values()) >= 3
    assert [PHASES.index(f.phase) for f in schedule] == sorted(PHASES.index(f.phase) for f in schedule)
    for fault in schedule:
        assert fault.phase == STAGE.get(fault.kind, fault.phase) and fault.phase in WHERE.get(
            fault.kind, PHASES
        )
        assert 0 < fault.delay_s <= MAX_DELAY_S["long"][fault.phase]
    run: dict[str, int] = {}  # pool faults since the last restart, per phase
    for fault in schedule:
        if fault.kind in RESTARTS:
            run = {}
        else:
            run[fault.phase] = run.get(fault.phase, 0) + 1
            assert run[fault.phase] <= MAX_POOL_FAULTS, schedule


def test_too_few_restarts_for_the_pool_faults_is_refused() -> None:
    with pytest.raises(ValueError, match="restarts needed"):
        draw_schedule(0, {"teacher": MAX_POOL_FAULTS + 1}, MAX_DELAY_S["quick"])
