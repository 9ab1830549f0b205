"""Where a figure or a bug report comes from: the package version, the git commit of the code that ran, the
record formats of every cached result, and the machine.

`specray --version` prints the first three; results files (`specray/cli/results.py`) record all four. The
commit is read with `git` from the folder the package was imported from, so an editable install or a checkout
on `PYTHONPATH` names its own commit and an installed wheel (no `.git` beside it) says "unknown" rather than
guess. Nothing here imports torch, Ray or MLflow at module level: `--version` stays instant.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import specray

PACKAGE_DIR = Path(specray.__file__).resolve().parent


def git_commit(folder: Path = PACKAGE_DIR) -> str | None:
    """The short commit of the checkout `folder` lies in, with `+dirty` when tracked files differ from it;
    None outside a git checkout or without git."""
    try:
        commit = _git(folder, "rev-parse", "--short=7", "HEAD")
        dirty = _git(folder, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


def _git(folder: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(folder), *args], capture_output=True, text=True, check=True, timeout=10
    )
    return result.stdout.strip()


def record_formats() -> dict[str, int]:
    """The format version of keys and records (`specray.keys.format`): a cached result stored under another
    number is recomputed, so a changed number tells a user why a re-run redoes work."""
    from specray.keys.format import FORMAT_VERSION

    return {"FORMAT_VERSION": FORMAT_VERSION}


def version_text() -> str:
    """What `specray --version` prints."""
    commit = git_commit() or "unknown"
    formats = ", ".join(f"{name} {value}" for name, value in sorted(record_formats().items()))
    return f"specray {specray.__version__} (commit {commit})\nrecord formats: {formats}"


def machine() -> dict[str, object]:
    """The hardware a measurement ran on: CPU model, cores Python may use, memory, GPU (or none)."""
    return {
        "cpu": _cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpu": _gpu(),
        "system": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _gpu() -> str:
    import torch

    if not torch.cuda.is_available():
        return "none"
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
