"""The Parquet shard store: teacher responses, one shard per τ, cached by a content key.

A shard holds one response per prompt of one example list, sampled by one teacher at one temperature.
Its key hashes everything the rows depend on (teacher id, engine, dtype, dataset fingerprint, template,
τ, max_new_tokens, seed, this file's format), so reruns, sweeps and Tune trials reuse it. Layout under
`cache_dir()/shards/<digest>/`:

    parts/part-<id>.parquet   progress while generating; each part is written atomically
    shard.parquet             the complete shard, rows in prompt order (parts are compacted into it)
    manifest.json             written last, atomically: the shard is complete iff this file exists

Every file is written to a temporary name in the same folder, fsynced, then `os.replace`d, so a crash
never leaves a half-written file under a real name; stale temporaries are ignored and removed on
completion. Reading validates the schema, and for a complete shard the row count and sha256 recorded in
the manifest, and names the file in a DataError when something is off.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from specray.errors import DataError
from specray.files import cache_dir, file_sha256, write_atomic, write_json

if TYPE_CHECKING:
    pass

SHARD_FORMAT = 1  # bump when the schema or the sampling recipe changes, so old shards are not reused
SHARD_FILE, MANIFEST_FILE, PARTS_DIR = "shard.parquet", "manifest.json", "parts"
SHARD_SCHEMA = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("prompt", pa.string()),
        ("response", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("response_token_ids", pa.list_(pa.int32())),
        ("tau", pa.float64()),
        ("seed", pa.int64()),
        ("teacher", pa.string()),
        ("finish_reason", pa.string()),
    ]
)


@dataclass(frozen=True)
class ShardKey:
    """What a shard's rows depend on. `dataset` is the fingerprint of the prompts' example list."""

    teacher: str
    engine: str
    dtype: str
    dataset: str
    template: str
    tau: float
    max_new_tokens: int
    seed: int

    @property
    def digest(self) -> str:
        payload = json.dumps({"format": SHARD_FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:24]


def shards_root() -> Path:
    return cache_dir() / "shards"


def shard_dir(key: ShardKey, root: Path | None = None) -> Path:
    return (root or shards_root()) / key.digest


# ---------------------------------------------------------------- atomic writes


def _write_table(path: Path, table: pa.Table) -> None:
    write_atomic(path, lambda tmp: pq.write_table(table, tmp))


def _write_json(path: Path, payload: Mapping[str, Any]) -> None:
    write_json(path, payload, indent=2)


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts with the SHARD_SCHEMA columns) as a table of exactly that schema."""
    return pa.Table.from_pylist(list(rows), schema=SHARD_SCHEMA)


# ---------------------------------------------------------------- validated reads


def _schema_problems(schema: pa.Schema) -> str:
    expected = {f.name: f.type for f in SHARD_SCHEMA}
    found = {f.name: f.type for f in schema}
    problems = [f"missing column {n!r}" for n in expected if n not in found]
    problems += [f"unexpected column {n!r}" for n in found if n not in expected]
    problems += [
        f"column {n!r} is {found[n]}, expected {t}"
        for n, t in expected.items()
        if n in found and found[n] != t
    ]
    return "; ".join(problems) or "columns are out of order"


def read_table(path: Path) -> pa.Table:
    """One shard or part file, checked against SHARD_SCHEMA; a DataError names the file otherwise."""
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path}: unreadable Parquet file ({detail}); delete it to regenerate") from None
    if not table.schema.equals(SHARD_SCHEMA, check_metadata=False):
        raise DataError(f"{path}: not a specray shard: {_schema_problems(table.schema)}")
    return table


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a complete shard, or None while the shard is incomplete."""
    path = folder / MANIFEST_FILE
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: corrupt shard manifest ({e}); delete {folder} to regenerate") from None
    if not isinstance(manifest, dict) or {"rows", "sha256"} - manifest.keys():
        raise DataError(f"{path}: shard manifest lacks 'rows' or 'sha256'; delete {folder} to regenerate")
    return manifest


def is_complete(key: ShardKey, root: Path | None = None) -> bool:
    return (shard_dir(key, root) / MANIFEST_FILE).exists()


def read_shard(key: ShardKey | Path, root: Path | None = None) -> pa.Table:
    """A complete shard (by key or folder), rows in prompt order, validated against its manifest."""
    folder = key if isinstance(key, Path) else shard_dir(key, root)
    manifest = read_manifest(folder)
    if manifest is None:
        raise DataError(f"{folder}: shard is not complete (no {MANIFEST_FILE}); run `specray generate`")
    path = folder / SHARD_FILE
    if not path.exists():
        raise DataError(f"{path}: shard file missing although {MANIFEST_FILE} exists; delete {folder}")
    if file_sha256(path) != manifest["sha256"]:
        raise DataError(
            f"{path}: checksum differs from {MANIFEST_FILE} (truncated or corrupt); delete {folder}"
        )
    table = read_table(path)
    if table.num_rows != manifest["rows"]:
        raise DataError(f"{path}: {table.num_rows} rows, manifest says {manifest['rows']}; delete {folder}")
    return table


# ---------------------------------------------------------------- progress and completion


def _part_files(key: ShardKey, root: Path | None) -> list[Path]:
    return sorted((shard_dir(key, root) / PARTS_DIR).glob("part-*.parquet"))  # temporaries start with "."


def write_part(key: ShardKey, rows: Sequence[Mapping[str, Any]], root: Path | None = None) -> Path:
    """Save some of a shard's rows as one more part file (atomic); returns its path."""
    path = shard_dir(key, root) / PARTS_DIR / f"part-{uuid.uuid4().hex[:16]}.parquet"
    _write_table(path, rows_to_table(rows))
    return path


def read_parts(key: ShardKey, root: Path | None = None) -> pa.Table:
    """Every row saved so far for an incomplete shard (validated; may hold duplicates after a crash)."""
    tables = [read_table(path) for path in _part_files(key, root)]
    return pa.concat_tables(tables) if tables else SHARD_SCHEMA.empty_table()


def done_prompt_ids(key: ShardKey, root: Path | None = None) -> set[str]:
    """Prompt ids already generated for this shard (all of them when it is complete)."""
    table = read_shard(key, root) if is_complete(key, root) else read_parts(key, root)
    return set(table.column("prompt_id").to_pylist())


def finalize_shard(
    key: ShardKey, prompt_ids: Sequence[str], root: Path | None = None, info: Mapping[str, Any] | None = None
) -> Path:
    """Compact the parts into `shard.parquet` (one row per prompt, in `prompt_ids` order), write the
    manifest, remove the parts. Returns the shard folder. Raises DataError if a prompt is missing."""
    folder = shard_dir(key, root)
    parts = read_parts(key, root)
    first_row = {pid: i for i, pid in reversed(list(enumerate(parts.column("prompt_id").to_pylist())))}
    missing = [pid for pid in prompt_ids if pid not in first_row]
    if missing:
        raise DataError(f"{folder}: cannot complete the shard, {len(missing)} prompts missing: {missing[:5]}")
    # A retried batch may have been saved twice; rows are deterministic, so keeping the first is exact.
    table = parts.take(pa.array([first_row[pid] for pid in prompt_ids], type=pa.int64()))
    _write_table(folder / SHARD_FILE, table)
    manifest = {
        "format": SHARD_FORMAT,
        "key": asdict(key),
        "rows": table.num_rows,
        "response_tokens": sum(len(ids) for ids in table.column("response_token_ids").to_pylist()),
        "sha256": file_sha256(folder / SHARD_FILE),
        **(info or {}),
    }
    _write_json(folder / MANIFEST_FILE, manifest)
    shutil.rmtree(folder / PARTS_DIR, ignore_errors=True)  # also drops temporaries of crashed writers
    return folder
