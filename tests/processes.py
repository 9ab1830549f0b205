"""A Python snippet in a separate process, with the repository on its path: how tests make a second writer
(another run, another producer) that contends with this one for a folder or a cache entry."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def python_process(script: str, *args: str, stdin: bool = False) -> subprocess.Popen:
    """Start `script` (dedented) with `args` in its sys.argv; stdout and stderr piped, as text; stdin piped
    when the script waits to be told (e.g. when to let go of a lock)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=REPO,
        env=ENV,
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
