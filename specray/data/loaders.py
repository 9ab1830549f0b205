"""Loaders that turn instruction datasets into `Example`s, built on the `datasets` library.

Sources: Alpaca-form JSON / JSON Lines (a local file or a hub name such as `tatsu-lab/alpaca`), GSM8K jsonl
(question, answer), self-instruct seed tasks (one Example per instance) and Parquet with Alpaca columns or
a column mapping. Every loader validates rows with one helper: a row without a non-empty text instruction
and output is skipped and counted, and a source with no usable row is an error. Problems a user can fix
raise `DataError` with a single-line message that names the file or source.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import datasets
import datasets.exceptions
import pyarrow

from specray.data.examples import Example
from specray.errors import DataError
from specray.named_files import looks_like_local_data, missing_file_message

logger = logging.getLogger(__name__)

KINDS = ("alpaca", "gsm8k", "self_instruct", "parquet", "jsonl")
# Fields a column mapping may rename; "family" is optional and lets an exported corpus keep its families.
MAPPABLE_FIELDS = ("id", "instruction", "input", "output", "family")
# What `datasets` / pyarrow raise for an unreadable file: parse errors arrive wrapped in
# DatasetGenerationError, UTF-8 and JSON errors as ValueError, a blank file as StopIteration.
_READ_ERRORS = (
    datasets.exceptions.DatasetsError,
    pyarrow.ArrowException,
    ValueError,
    OSError,
    StopIteration,
)


def load_alpaca(source: str, split: str = "train", columns: Mapping[str, str] | None = None) -> list[Example]:
    """Alpaca-form rows (instruction, input, output) from a local .json/.jsonl file or a hub dataset.

    `source` is read as a local file when it exists or looks like a path; otherwise it is a hub name
    loaded with `split` (a local file is one split, so `split` is ignored for it). `input` may be
    missing or null. Ids come from an `id` column when present, else `"{stem}:{row_index}"`.
    `columns` optionally maps Alpaca field names to the source's column names.
    """
    if looks_like_local_data(source):
        return _alpaca_examples(source, _read_local(source, "json"), Path(source).stem, columns)
    return _alpaca_examples(source, _read_hub(source, split), source.rsplit("/", 1)[-1], columns)


def load_gsm8k(path: str) -> list[Example]:
    """GSM8K jsonl rows (question, answer) as examples with no input and family "gsm8k"."""
    rows = _read_local(path, "json")
    _require_columns(path, rows.column_names, ["question", "answer"])
    stem = Path(path).stem
    candidates = (
        _candidate(f"gsm8k/{stem}:{index}", row["question"], "", row["answer"], "gsm8k")
        for index, row in enumerate(rows)
    )
    return _validated(path, candidates, needs="'question' and 'answer'")


def load_self_instruct(path: str) -> list[Example]:
    """Self-instruct seed tasks (id, name, instruction, instances): one example per instance.

    Ids are `"{task_id}:{instance_index}"`; a task without instances counts as one skipped row.
    """
    rows = _read_local(path, "json")
    _require_columns(path, rows.column_names, ["instruction", "instances"])
    stem = Path(path).stem
    candidates = (
        candidate
        for index, row in enumerate(rows)
        for candidate in _instance_candidates(row, _row_id(row.get("id"), f"{stem}:{index}"))
    )
    return _validated(path, candidates, needs="'instruction' and an instance 'output'")


def load_parquet(path: str, columns: Mapping[str, str] | None = None) -> list[Example]:
    """A local Parquet file with Alpaca columns, or `columns` mapping Alpaca field names to its columns.

    Example: `load_parquet("shard.parquet", {"instruction": "prompt", "output": "response"})`.
    """
    return _alpaca_examples(path, _read_local(path, "parquet"), Path(path).stem, columns)


def load_examples(
    kind: str, path: str, *, split: str = "train", columns: Mapping[str, str] | None = None
) -> list[Example]:
    """Dispatch on `kind` (one of `KINDS`); "jsonl" is an Alpaca-form local file, never a hub name."""
    if kind not in KINDS:
        raise DataError(f"{path}: unknown data kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    if kind == "alpaca":
        return load_alpaca(path, split, columns)
    if kind == "jsonl":
        return _alpaca_examples(path, _read_local(path, "json"), Path(path).stem, columns)
    if kind == "parquet":
        return load_parquet(path, columns)
    if columns:
        raise DataError(f"{path}: a column mapping is only supported for kinds alpaca, jsonl and parquet")
    return load_gsm8k(path) if kind == "gsm8k" else load_self_instruct(path)


def _alpaca_examples(
    source: str, rows: datasets.Dataset, stem: str, columns: Mapping[str, str] | None
) -> list[Example]:
    """Examples from rows with Alpaca columns (renamed by `columns`); `input` and `family` are optional."""
    names = _column_names(source, columns)
    # A field the user mapped explicitly must exist; unmapped optional fields may be absent.
    needed = [
        "instruction",
        "output",
        *(field for field in (columns or {}) if field not in ("instruction", "output")),
    ]
    _require_columns(source, rows.column_names, [names[field] for field in needed])
    candidates = (
        _candidate(
            _row_id(row.get(names["id"]), f"{stem}:{index}"),
            row.get(names["instruction"]),
            row.get(names["input"]),
            row.get(names["output"]),
            row.get(names["family"]),
        )
        for index, row in enumerate(rows)
    )
    return _validated(source, candidates, needs=f"'{names['instruction']}' and '{names['output']}'")


def _column_names(source: str, columns: Mapping[str, str] | None) -> dict[str, str]:
    """Map every mappable Alpaca field to the source's column name (itself unless `columns` renames it)."""
    columns = dict(columns or {})
    unknown = sorted(set(columns) - set(MAPPABLE_FIELDS))
    if unknown:
        raise DataError(
            f"{source}: unknown field(s) {', '.join(unknown)} in the column mapping; "
            f"valid fields: {', '.join(MAPPABLE_FIELDS)}"
        )
    return {field: columns.get(field, field) for field in MAPPABLE_FIELDS}


def _require_columns(source: str, have: list[str], needed: list[str]) -> None:
    """Fail with the missing and the present column names when `needed` columns are absent."""
    missing = [column for column in needed if column not in have]
    if missing:
        raise DataError(
            f"{source}: missing column(s) {', '.join(missing)}; "
            f"the source has columns: {', '.join(have) or '(none)'}"
        )


def _instance_candidates(task: dict[str, Any], task_id: str) -> Iterator[dict[str, Any]]:
    """One candidate per instance of a self-instruct task; a task without instances yields one bad row."""
    instances = task.get("instances")
    if not isinstance(instances, list) or not instances:
        yield _candidate(f"{task_id}:0", task.get("instruction"), "", None, "self_instruct")
        return
    for k, instance in enumerate(instances):
        instance = instance if isinstance(instance, dict) else {}
        instruction, output = task.get("instruction"), instance.get("output")
        yield _candidate(f"{task_id}:{k}", instruction, instance.get("input"), output, "self_instruct")


def _candidate(id: str, instruction: Any, input: Any, output: Any, family: Any) -> dict[str, Any]:
    """A not-yet-validated example: raw values as read, checked by `_validated`."""
    return {"id": id, "instruction": instruction, "input": input, "output": output, "family": family}


def _validated(source: str, candidates: Iterable[dict[str, Any]], needs: str) -> list[Example]:
    """Keep the candidates that make valid examples; log the skipped ones once; fail when none is left."""
    examples: list[Example] = []
    total, first_bad = 0, None
    for fields in candidates:
        total += 1
        example = _example_or_none(fields)
        if example is not None:
            examples.append(example)
        elif first_bad is None:
            first_bad = fields["id"]
    if not examples:
        raise DataError(f"{source}: no usable rows ({total} rows read; each needs a non-empty {needs})")
    if len(examples) < total:
        logger.warning(
            "%s: skipped %d of %d rows with a missing, empty or non-text field (first bad row: %s)",
            source,
            total - len(examples),
            total,
            first_bad,
        )
    return examples


def _example_or_none(fields: dict[str, Any]) -> Example | None:
    """The example, or None when instruction/output is not non-empty text or input is not text."""
    instruction, output, input = fields["instruction"], fields["output"], fields["input"]
    if not (_is_text(instruction) and _is_text(output)):
        return None
    if input is not None and not isinstance(input, str):
        return None
    family = fields["family"] if isinstance(fields["family"], str) else ""
    return Example(fields["id"], instruction, input or "", output, family)


def _row_id(value: Any, fallback: str) -> str:
    """The source's own id when it has one (ints included), else the positional fallback."""
    return fallback if value is None or value == "" else str(value)


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _read_local(source: str, builder: str) -> datasets.Dataset:
    """Read one local file with the `datasets` "json" or "parquet" builder, in memory."""
    path = Path(source).expanduser()
    if (problem := missing_file_message(source)) is not None:
        raise DataError(problem)
    if path.stat().st_size == 0:
        raise DataError(f"{source}: the file is empty (0 rows read)")
    if builder == "json":
        _check_utf8(source, path)
    try:
        # A throwaway cache: a local file is cheap to re-parse, and `datasets` would otherwise leave an Arrow
        # copy in the user cache and could serve a stale one after an edit within the same mtime tick.
        with _quiet_datasets(), tempfile.TemporaryDirectory(prefix="specray-data-") as cache_dir:
            return datasets.load_dataset(
                builder, data_files=str(path), split="train", keep_in_memory=True, cache_dir=cache_dir
            )
    except _READ_ERRORS as error:
        raise DataError(f"{source}: {_describe_read_error(path, builder, error)}") from error


def _check_utf8(source: str, path: Path, chunk_bytes: int = 1 << 20) -> None:
    """pyarrow's JSON reader passes some invalid UTF-8 through (a lone Latin-1 byte inside a string) and
    fails only when the row is read; check the encoding up front, in chunks."""
    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    with path.open("rb") as handle:
        while True:
            chunk = handle.read(chunk_bytes)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as bad:
                byte, position = bad.object[bad.start], offset + bad.start  # ± a chunk boundary
                raise DataError(
                    f"{source}: not valid UTF-8 text (byte {byte:#04x} at offset {position}); "
                    "save it as UTF-8"
                ) from bad
            if not chunk:
                return
            offset += len(chunk)


def _describe_read_error(path: Path, builder: str, error: BaseException) -> str:
    """Say what is wrong with the file; the encoding is checked here because pyarrow reports bad
    UTF-8 as a generic JSON parse error."""
    cause = (
        error.__cause__ if isinstance(error, datasets.exceptions.DatasetsError) and error.__cause__ else error
    )
    if isinstance(error, OSError) and not isinstance(error, UnicodeError):
        return f"cannot read the file ({_one_line(cause)})"
    if builder == "parquet":
        return f"not a readable Parquet file ({_one_line(cause)})"
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as bad:
        byte = bad.object[bad.start]
        return f"not valid UTF-8 text (byte {byte:#04x} at offset {bad.start}); save it as UTF-8"
    if not text.strip():
        return "the file holds only whitespace (0 rows read)"
    with contextlib.suppress(ValueError):
        if json.loads(text) in ([], {}):
            return "the file holds an empty JSON list or object (0 rows read)"
    return f"not valid JSON or JSON Lines ({_one_line(cause)})"


def _read_hub(name: str, split: str) -> datasets.Dataset:
    """Load `split` of a hub dataset (needs network or a warm `datasets` cache)."""
    try:
        with _quiet_datasets():
            return datasets.load_dataset(name, split=split, keep_in_memory=True)
    # Offline, unknown name, gated repo, unknown split: each raises a different type, one cause for the user.
    except Exception as error:
        raise DataError(
            f"{name}: not a local file, and loading it from the Hugging Face hub failed ({_one_line(error)})"
        ) from error


def _one_line(error: BaseException) -> str:
    """`Type: first line of the message`, shortened, so DataError messages stay single-line."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Silence `datasets` progress bars and its error logs (re-raised here as one DataError) for one call.

    This flips process-wide `datasets` settings, so they are restored on the way out.
    """
    bars_were_on = datasets.is_progress_bar_enabled()
    verbosity = datasets.utils.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets.utils.logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.enable_progress_bars()
