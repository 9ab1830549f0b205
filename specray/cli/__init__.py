"""The `specray` command line. Each subcommand validates its spec before doing any work.

One module per group of commands: `stages` (validate, generate, distill, evaluate: one stage at a time),
`sweep` (run, report, export, tune: a whole sweep), `tools` (the zoo and a sweep's data), `bench`
(Spec-Bench's protocol on your models), `jobs` (submit and follow jobs on a Ray cluster); `common` holds the
app and what the commands share.
"""

from __future__ import annotations

# Importing a module registers its commands; `specray --help` lists them in this order.
from specray.cli import stages  # noqa: F401

# isort: split
from specray.cli import sweep  # noqa: F401

# isort: split
from specray.cli import bench, jobs, tools  # noqa: F401
from specray.cli.common import app, resumable, user_errors

__all__ = ["app", "resumable", "user_errors"]
