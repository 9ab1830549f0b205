"""The `specray` executable's quick exit (`specray.cli.main`): it skips only the interpreter's teardown —
the command's status, its output, the atexit hooks and the threads still running all come out as with a
normal exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# A child process: an atexit hook and a non-daemon thread that both write a file after `main()` returns;
# then the command line given in argv[2:].
CHILD = """
import atexit, sys, threading, time
from pathlib import Path
out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.3)
    (out / "thread").write_text("joined")
threading.Thread(target=late).start()
print("printed before the command")  # stdout is a pipe: this waits in its buffer for the exit's flush
sys.argv = ["specray", *sys.argv[2:]]
from specray.cli import main
main()
raise AssertionError("main() returned")
"""


def _specray(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "status", "stdout", "stderr"),
    [
        (["--version"], 0, "specray ", ""),
        (["no-such-command"], 2, "", "No such command"),  # click's usage error: status 2
        (["run", "no-such-sweep.yaml"], 2, "", "no-such-sweep.yaml"),  # specray's one-line user error
    ],
)
def test_the_status_output_exit_hooks_and_threads_are_those_of_a_normal_exit(
    tmp_path: Path, args: list[str], status: int, stdout: str, stderr: str
) -> None:
    result = _specray(tmp_path, *args)
    assert result.returncode == status, result.stderr
    assert stdout in result.stdout and stderr in result.stderr
    assert result.stdout.startswith("printed before the command\n")
    assert "main() returned" not in result.stderr
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "joined"


def test_a_message_given_to_sys_exit_is_printed_with_status_1(tmp_path: Path) -> None:
    child = "import sys; sys.argv = ['specray', '--version']\n"
    child += "import specray.cli as cli\n"
    child += "def app(): sys.exit('stopped: a message')\n"
    child += "cli.app = app\ncli.main()\n"
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.strip() == "stopped: a message"


def test_output_larger_than_a_pipe_buffer_arrives_whole(tmp_path: Path) -> None:
    # `specray schema` prints the whole JSON Schema (tens of KB) in one write just before it ends: a quick
    # exit must not cut what is still in stdout's buffer
    result = subprocess.run(
        [str(Path(sys.executable).parent / "specray"), "schema"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("}") and len(result.stdout) > 1000
