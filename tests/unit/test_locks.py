"""One run per output folder, one producer per cache entry (`specray/locks.py`), across real processes."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from specray.locks import FOLDER_LOCK, FolderInUse, output_folder, producing
from tests.processes import python_process
from tests.waiting import wait_until


def _python(script: str, *args: str):  # a holder that waits on its stdin to let go
    return python_process(script, *args, stdin=True)


HOLD_FOLDER = """
    import sys, time
    from pathlib import Path
    from specray.locks import output_folder
    with output_folder(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(600)
"""


def test_a_second_run_on_a_held_folder_is_refused_naming_the_holder_and_a_killed_holder_frees_it(
    tmp_path: Path,
) -> None:
    holder = _python(HOLD_FOLDER, str(tmp_path))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse) as refused, output_folder(tmp_path):
            pytest.fail("the folder was given to a second holder")
        message = str(refused.value)
        assert f"{tmp_path} is in use by pid {holder.pid} on " in message
        assert "another output_dir=PATH" in message and "\n" not in message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with output_folder(tmp_path):  # the kernel dropped the dead holder's lock: no stale lock to clear
        info = json.loads((tmp_path / FOLDER_LOCK).read_text())
        assert info["pid"] == os.getpid()


def test_a_folder_is_free_again_after_its_run_ends_or_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), output_folder(tmp_path):
        raise RuntimeError("a run that fails")
    with output_folder(tmp_path):
        pass


def test_producers_of_overlapping_entries_take_them_in_one_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    notes: list[str] = []
    with producing([b, a], "x", notes.append), producing([], "nothing", notes.append):
        assert sorted(p.name for p in tmp_path.iterdir()) == [".a.lock", ".b.lock"]
    assert notes == []


def test_a_waiting_producer_says_what_it_waits_for(tmp_path: Path) -> None:
    entry = tmp_path / "shard"
    # the holder keeps the entry until told on stdin, so the wait below happens however slow the machine
    holder = _python(
        """
        import sys
        from pathlib import Path
        from specray.locks import producing
        with producing([Path(sys.argv[1])], "a teacher shard"):
            print("held", flush=True)
            sys.stdin.readline()
        """,
        str(entry),
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    notes: list[str] = []
    waiter = threading.Thread(target=lambda: producing([entry], "a teacher shard", notes.append).__enter__())
    waiter.start()
    wait_until(lambda: notes, "the second producer to say what it waits for")
    assert holder.stdin is not None
    holder.stdin.write("release\n")
    holder.stdin.flush()
    waiter.join(timeout=120)
    assert not waiter.is_alive()  # it got the entry once the holder let go
    assert f"pid {holder.pid} on " in notes[0] and f"is producing a teacher shard ({entry})" in notes[0]
    holder.wait(timeout=120)
