"""The Parquet shard store: content keys, atomic writes, resume from parts, validation of what is read."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specray.config import load_spec
from specray.data.shards import (
    MANIFEST_FILE,
    PARTS_DIR,
    SHARD_FILE,
    ShardKey,
    done_prompt_ids,
    finalize_shard,
    is_complete,
    read_shard,
    shard_dir,
    write_atomic,
    write_part,
)
from specray.errors import DataError
from specray.keys import teacher_id, train_shard_keys
from tests.conftest import REPO

KEY = ShardKey(
    teacher="zoo/abc/target",
    engine="transformers",
    dtype="auto",
    dataset="0123456789abcdef",
    template="alpaca",
    tau=0.5,
    max_new_tokens=24,
    seed=0,
)


def row(prompt_id: str, response: str = "ok") -> dict:
    return {
        "prompt_id": prompt_id,
        "prompt": f"prompt of {prompt_id}",
        "response": response,
        "prompt_token_ids": [1, 7, 9],
        "response_token_ids": [11, 12, 2],
        "tau": KEY.tau,
        "seed": KEY.seed,
        "teacher": KEY.teacher,
        "finish_reason": "stop",
    }


def test_key_changes_with_every_field_and_is_stable() -> None:
    assert KEY.digest == ShardKey(**dataclasses.asdict(KEY)).digest
    changed = {"teacher": "x", "engine": "vllm", "dtype": "bfloat16", "dataset": "f" * 16,
               "template": "other", "tau": 0.6, "max_new_tokens": 25, "seed": 1}  # fmt: skip
    digests = {dataclasses.replace(KEY, **{name: value}).digest for name, value in changed.items()}
    assert len(digests | {KEY.digest}) == len(changed) + 1


def test_parts_then_finalize_gives_one_row_per_prompt_in_order(tmp_path: Path) -> None:
    write_part(KEY, [row("c"), row("a")], tmp_path)
    write_part(KEY, [row("b"), row("a")], tmp_path)  # "a" again, as after a retried batch
    assert done_prompt_ids(KEY, tmp_path) == {"a", "b", "c"}
    assert not is_complete(KEY, tmp_path)
    folder = finalize_shard(KEY, ["a", "b", "c"], tmp_path, {"split": "train"})
    table = read_shard(KEY, tmp_path)
    assert table.column("prompt_id").to_pylist() == ["a", "b", "c"]
    assert table.column("response_token_ids").type == pa.list_(pa.int32())
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST_FILE, SHARD_FILE]  # parts are gone
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert manifest["rows"] == 3 and manifest["split"] == "train" and manifest["key"]["tau"] == 0.5
    assert read_shard(folder).equals(table)


def test_finalize_refuses_a_shard_with_missing_prompts(tmp_path: Path) -> None:
    write_part(KEY, [row("a")], tmp_path)
    with pytest.raises(DataError, match=r"1 prompts missing: \['b'\]"):
        finalize_shard(KEY, ["a", "b"], tmp_path)
    assert not is_complete(KEY, tmp_path)


def test_a_failed_write_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "part-x.parquet"

    def half_then_fail(tmp: Path) -> None:
        tmp.write_bytes(b"PAR1 half a file")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, half_then_fail)
    assert list(tmp_path.iterdir()) == []


CRASH_MID_WRITE = """
import os, sys
from pathlib import Path
import pyarrow.parquet as pq
from specray.data import shards
from tests.unit.test_shards import KEY, row

def write_half_then_die(table, where, **kwargs):
    Path(where).write_bytes(b"PAR1" + b"\\0" * 100)  # a torn write ...
    os._exit(9)                                       # ... and the process dies (no cleanup runs)

pq.write_table = write_half_then_die
shards.write_part(KEY, [row("b")], Path(sys.argv[1]))
"""


def test_a_crash_mid_write_leaves_no_visible_part_and_resume_ignores_it(tmp_path: Path) -> None:
    write_part(KEY, [row("a")], tmp_path)
    crashed = subprocess.run([sys.executable, "-c", CRASH_MID_WRITE, str(tmp_path)], cwd=REPO, check=False)
    assert crashed.returncode == 9
    parts = shard_dir(KEY, tmp_path) / PARTS_DIR
    leftovers = [p.name for p in parts.iterdir() if p.name.startswith(".")]
    assert len(leftovers) == 1 and leftovers[0].endswith(".tmp")  # the torn file kept its temporary name
    assert done_prompt_ids(KEY, tmp_path) == {"a"}  # resume would regenerate "b" only
    write_part(KEY, [row("b")], tmp_path)
    finalize_shard(KEY, ["a", "b"], tmp_path)
    assert not parts.exists()  # completion sweeps the temporaries away
    assert read_shard(KEY, tmp_path).num_rows == 2


def test_a_truncated_shard_is_refused_naming_the_file(tmp_path: Path) -> None:
    write_part(KEY, [row("a"), row("b")], tmp_path)
    folder = finalize_shard(KEY, ["a", "b"], tmp_path)
    data = (folder / SHARD_FILE).read_bytes()
    (folder / SHARD_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=rf"{folder / SHARD_FILE}: checksum differs .*truncated or corrupt"):
        read_shard(KEY, tmp_path)


def test_a_corrupt_part_is_refused_naming_the_file(tmp_path: Path) -> None:
    part = write_part(KEY, [row("a")], tmp_path)
    part.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=rf"{part}: unreadable Parquet file"):
        done_prompt_ids(KEY, tmp_path)


def test_a_wrong_schema_is_refused_naming_the_file_and_column(tmp_path: Path) -> None:
    part = shard_dir(KEY, tmp_path) / PARTS_DIR / "part-foreign.parquet"
    part.parent.mkdir(parents=True)
    table = pa.table({"prompt_id": ["a"], "response": ["x"], "response_token_ids": [[1.5]]})
    pq.write_table(table, part)
    with pytest.raises(DataError, match=rf"{part}: not a specray shard: missing column 'prompt'") as error:
        done_prompt_ids(KEY, tmp_path)
    assert "column 'response_token_ids' is list<element: double>" in str(error.value)


def test_a_corrupt_manifest_is_refused_naming_the_file(tmp_path: Path) -> None:
    write_part(KEY, [row("a")], tmp_path)
    folder = finalize_shard(KEY, ["a"], tmp_path)
    (folder / MANIFEST_FILE).write_text('{"rows": 1, "sha2')
    with pytest.raises(DataError, match=rf"{folder / MANIFEST_FILE}: corrupt shard manifest"):
        read_shard(KEY, tmp_path)


def test_train_shard_keys_cover_the_tau_grid_and_name_the_teacher(tmp_path: Path) -> None:
    spec = load_spec(REPO / "sweeps" / "smoke.yaml")
    keys = train_shard_keys(spec)
    assert list(keys) == spec.teacher.temperatures
    assert {key.teacher for key in keys.values()} == {teacher_id(spec.models)}
    assert teacher_id(spec.models).startswith("zoo/") and teacher_id(spec.models).endswith("/target")
    assert len({key.digest for key in keys.values()}) == len(keys)
    assert not any(is_complete(key, tmp_path) for key in keys.values())  # nothing generated here yet
