"""The local files and folders a sweep spec names, checked before anything heavy is imported.

A mistyped data path or model folder is the commonest bad input; the loaders would find it too, but only
after seconds of imports (datasets, transformers). `check_named_files` refuses it at once, naming the spec's
field. It runs where the work runs (`specray run` and the stage commands), not on specs read for another
machine (`specray submit`: the cluster's paths need not exist here). The two predicates say which names are
local paths rather than hub names; the loaders use the same ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from specray.errors import DataError, ModelError

if TYPE_CHECKING:
    from specray.config import SourceSpec, SweepSpec

LOCAL_DATA_SUFFIXES = (".json", ".jsonl", ".parquet")
HUB_DATA_KINDS = ("alpaca",)  # the only kind whose path may also be a hub dataset name


def looks_like_local_data(source: str) -> bool:
    """A local file when it exists or looks like a path, so a mistyped path is not sent to the hub."""
    path = Path(source).expanduser()
    looks_like_path = source.startswith(("/", ".", "~")) or source.count("/") > 1
    return path.exists() or looks_like_path or path.suffix.lower() in LOCAL_DATA_SUFFIXES


def looks_like_local_model(path: str) -> bool:
    """A path (absolute, ./ or ../, or existing) is never sent to the hub: a typo must fail as 'not found'."""
    return Path(path).is_absolute() or path.startswith(".") or Path(path).exists()


def missing_file_message(source: str | Path) -> str | None:
    """Why `source` cannot be read as a local file, or None when it is one."""
    path = Path(source).expanduser()
    if path.is_file():
        return None
    return f"{source}: file not found" if not path.exists() else f"{source}: not a file"


def missing_model_message(path: str) -> str | None:
    """Why `path` names no local model folder, or None when it is one or a hub name."""
    if looks_like_local_model(path) and not Path(path).is_dir():
        return f"{path}: model directory not found"
    return None


def check_named_files(spec: SweepSpec) -> None:
    """Raise DataError / ModelError, naming the field, for the first local data file or model folder the
    spec names that is not there. Hub names are left to the loaders."""
    sources: list[tuple[str, SourceSpec]] = [
        ("data.train", spec.data.train),
        ("data.out_of_domain", spec.data.out_of_domain),
        *((f"data.test_sets.{name}.source", test.source) for name, test in spec.data.test_sets.items()),
    ]
    for field, source in sources:
        if source.path is None:  # synthetic
            continue
        if source.kind in HUB_DATA_KINDS and not looks_like_local_data(source.path):
            continue
        problem = missing_file_message(source.path)
        if problem is not None:
            raise DataError(f"{field}.path: {problem}")
    models = spec.models
    refs = [("models.target", models.target), ("models.draft", models.draft)]
    refs += [(f"models.garden[{i}]", ref) for i, ref in enumerate(models.garden)]
    for field, ref in refs:
        if ref.name_or_path is not None and (problem := missing_model_message(ref.name_or_path)):
            raise ModelError(f"{field}.name_or_path: {problem}")
