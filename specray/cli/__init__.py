"""The `specray` command line. Each subcommand validates its spec before doing any work.

One module per group of commands: `stages` (validate, generate, distill, evaluate: one stage at a time),
`sweep` (run, report, export, tune: a whole sweep), `tools` (the zoo and a sweep's data), `bench`
(Spec-Bench's protocol on your models), `jobs` (submit and follow jobs on a Ray cluster), `schema` (the sweep
spec's JSON Schema for editors); `common` holds the app and what the commands share, `provenance` the version,
commit and machine that `--version` and results files report, `results` the results files docs quote.
"""

from __future__ import annotations

# Importing a module registers its commands; `specray --help` lists them in this order.
from specray.cli import stages  # noqa: F401

# isort: split
from specray.cli import sweep  # noqa: F401

# isort: split
from specray.cli import bench, jobs, schema, tools  # noqa: F401
from specray.cli.common import app, resumable, user_errors

__all__ = ["app", "resumable", "user_errors"]
