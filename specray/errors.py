"""User-facing errors. The CLI turns these into one clear line and exit code 2, never a traceback.

They live in this import-light module so that catching them does not import torch, transformers or datasets.
"""

from __future__ import annotations


class SpecError(ValueError):
    """A sweep spec that cannot be used; the message names the file and field path."""


class DataError(ValueError):
    """A problem with the user's data; the message is one line and names the file or source."""


class ModelError(ValueError):
    """A model that cannot be used: missing, unreadable, or incompatible with its partner."""


USER_ERRORS = (SpecError, DataError, ModelError)


class TrackingError(RuntimeError):
    """MLflow is unreachable or refused a call; the message names the tracking URI."""


def find_cause(error: BaseException, types: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of `types` in `error`'s chain, breadth first: `__cause__`, `__context__`, the
    cause a Ray task error wraps, and the worker and controller failures a Ray Train error carries."""
    queue, seen = [error], set()
    while queue:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, types):
            return current
        linked = [current.__cause__, current.__context__, getattr(current, "cause", None)]
        linked.append(getattr(current, "controller_failure", None))
        linked += list((getattr(current, "worker_failures", None) or {}).values())
        queue += [e for e in linked if isinstance(e, BaseException)]
    return None


def ray_cause(error: BaseException) -> BaseException:
    """The exception raised inside a Ray task or actor call, without Ray's wrapper. A `RayTaskError` (and
    the class Ray makes that is both it and the cause's class) prints a header with the process, node,
    actor id and repr before the cause; a user needs the cause's own message, not that header."""
    seen: set[int] = set()
    while isinstance(getattr(error, "cause", None), BaseException) and id(error) not in seen:
        seen.add(id(error))
        error = error.cause  # type: ignore[attr-defined]  # checked on the line above
    return error


def describe_os_error(error: OSError) -> str:
    """`[Errno 30] Read-only file system: '/out/x'` -> `Read-only file system: /out/x`."""
    if error.strerror and error.filename:
        return f"{error.strerror}: {error.filename}"
    return str(error) or type(error).__name__
