"""Loading untrusted model folders: no pickle is ever unpickled and no code from the folder ever runs unless
the spec sets `trust_remote_code`. Both traps below write a marker file if they are executed."""

from __future__ import annotations

import contextlib
import json
import pickle
import shutil
from pathlib import Path

import pytest

from specray.config import ModelRef
from specray.errors import ModelError
from specray.models.loading import load_model, load_tokenizer
from tests.conftest import REPO


class _Trap:
    """Unpickling this writes `path`: the classic pickle payload, made harmless."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "unpickled"))


def _pickle_trap(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps({"model.embed_tokens.weight": _Trap(str(marker))}))


def test_weights_come_from_safetensors_and_a_pickle_beside_them_is_never_opened(micro_zoo, tmp_path) -> None:
    folder, marker = tmp_path / "model", tmp_path / "unpickled"
    shutil.copytree(micro_zoo.target, folder)
    _pickle_trap(folder / "pytorch_model.bin", marker)
    model = load_model(str(folder))
    assert sum(p.numel() for p in model.parameters()) > 0
    assert not marker.exists()
    pickle.loads((folder / "pytorch_model.bin").read_bytes())  # the trap is live
    assert marker.exists()


def test_a_pickle_only_folder_is_refused_without_unpickling(micro_zoo, tmp_path) -> None:
    folder, marker = tmp_path / "model", tmp_path / "unpickled"
    shutil.copytree(micro_zoo.target, folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    _pickle_trap(folder / "pytorch_model.bin", marker)
    with pytest.raises(ModelError, match="safetensors only"):
        load_model(str(folder))
    assert not marker.exists()


def _remote_code_folder(micro_zoo, tmp_path: Path) -> tuple[Path, Path]:
    """The micro target with a config that asks for custom code; importing that code writes a marker."""
    folder, marker = tmp_path / "remote", tmp_path / "code-ran"
    shutil.copytree(micro_zoo.target, folder)
    (folder / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "class EvilConfig(LlamaConfig):\n    model_type = 'evil'\n"
        "class EvilModel(LlamaForCausalLM):\n    config_class = EvilConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    config["model_type"] = "evil"
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer_config = folder / "tokenizer_config.json"
    settings = json.loads(tokenizer_config.read_text())
    settings["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    tokenizer_config.write_text(json.dumps(settings))
    return folder, marker


def test_code_shipped_in_a_model_folder_does_not_run_by_default(micro_zoo, tmp_path) -> None:
    folder, marker = _remote_code_folder(micro_zoo, tmp_path)
    with pytest.raises(ModelError, match=str(folder)):
        load_model(str(folder))
    with contextlib.suppress(ModelError):  # loads the standard tokenizer or refuses; never runs evil.py
        load_tokenizer(str(folder))
    assert not marker.exists()
    # the trap is live: with the spec's explicit consent the folder's code does run
    with contextlib.suppress(Exception):
        load_model(str(folder), trust_remote_code=True)
    assert marker.exists()


def test_trust_remote_code_is_off_unless_the_spec_says_so() -> None:
    assert ModelRef(zoo="target").trust_remote_code is False
    # no call site passes a literal True: the flag only ever comes from the spec
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "specray").rglob("*.py")
        if "trust_remote_code=True" in path.read_text()
    ]
    assert offenders == []
