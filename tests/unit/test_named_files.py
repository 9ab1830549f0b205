"""The local files a spec names are checked before any heavy import, each refusal naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from specray.config import load_spec
from specray.errors import DataError, ModelError
from specray.named_files import check_named_files
from tests.conftest import REPO

SMOKE = REPO / "sweeps" / "smoke.yaml"


def _spec(*overrides: str):
    return load_spec(SMOKE, list(overrides))


def test_the_shipped_sweep_names_no_local_file_and_passes() -> None:
    check_named_files(_spec())  # synthetic data, zoo models


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("data.train={kind: alpaca, path: MISSING}", "data.train.path"),
        ("data.out_of_domain={kind: gsm8k, path: MISSING}", "data.out_of_domain.path"),
        ("data.train={kind: parquet, path: MISSING}", "data.train.path"),
        (
            "data.test_sets={bench: {source: {kind: spec_bench, path: MISSING}}}",
            "data.test_sets.bench.source.path",
        ),
    ],
)
def test_a_missing_data_file_is_refused_by_its_field(override: str, field: str, tmp_path: Path) -> None:
    missing = tmp_path / "typo.jsonl"
    with pytest.raises(DataError) as refused:
        check_named_files(_spec(override.replace("MISSING", str(missing))))
    assert str(refused.value) == f"{field}: {missing}: file not found"


def test_a_folder_is_not_a_data_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=rf"^data.train.path: {tmp_path}: not a file$"):
        check_named_files(_spec(f"data.train={{kind: jsonl, path: {tmp_path}}}"))


def test_existing_files_and_hub_names_pass(tmp_path: Path) -> None:
    data = tmp_path / "train.json"
    data.write_text("[]")  # its contents are the loaders' business
    check_named_files(_spec(f"data.train={{kind: alpaca, path: {data}}}"))
    check_named_files(_spec("data.train={kind: alpaca, path: tatsu-lab/alpaca}"))  # a hub dataset name
    check_named_files(_spec("models.target={name_or_path: meta-llama/Llama-2-7b-hf}"))  # a hub model name


def test_a_missing_model_folder_is_refused_by_its_field(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelError) as refused:
        check_named_files(_spec(f"models.draft={{name_or_path: {missing}}}"))
    assert str(refused.value) == f"models.draft.name_or_path: {missing}: model directory not found"
    check_named_files(_spec(f"models.draft={{name_or_path: {tmp_path}}}"))  # a folder: the loader reads it
