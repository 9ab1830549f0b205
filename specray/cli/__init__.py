"""The `specray` command line. Each subcommand validates its spec before doing any work.

One module per group of commands: `stages` (validate, generate, distill, evaluate: one stage at a time),
`sweep` (run, report, export, tune: a whole sweep), `tools` (the zoo and a sweep's data), `bench`
(Spec-Bench's protocol on your models), `handoff` (τ_kd data out to other trainers, a vLLM server's
acceptance back), `jobs` (submit and follow jobs on a Ray cluster), `schema` (the sweep spec's JSON Schema
for editors); `common` holds the app and what the commands share, `provenance` the version, commit and
machine that `--version` and results files report, `results` the results files docs quote.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

# Importing a module registers its commands; `specray --help` lists them in this order.
from specray.cli import stages  # noqa: F401

# isort: split
from specray.cli import sweep  # noqa: F401

# isort: split
from specray.cli import bench, handoff, jobs, schema, tools  # noqa: F401
from specray.cli.common import app, resumable, user_errors

__all__ = ["app", "main", "resumable", "user_errors"]


def main() -> None:
    """The `specray` executable: the app, then a quick exit.

    A process that has imported torch, transformers, Ray and MLflow spends about two seconds of CPU at
    exit tearing its modules down and collecting their objects: every command paid it after its work was
    done. So once the command has returned (or exited), this does what the interpreter's exit does that
    matters here, in the interpreter's order — join the non-daemon threads (and run threading's own exit
    hooks, which stop idle thread pools), run the atexit hooks (Ray's shutdown, MLflow's, logging's flush),
    flush stdout and stderr — and ends the process with os._exit, skipping the teardown. An exception other
    than SystemExit takes the interpreter's normal path (its traceback, its exit)."""
    try:
        app()
        code: int | str | None = 0
    except SystemExit as done:
        code = done.code
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()
    if isinstance(code, str):  # sys.exit("message"): printed, status 1, as the interpreter does
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        # a closed pipe (`specray ... | head`): nothing more to write
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code or 0)
