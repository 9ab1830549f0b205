"""Whether two runs of one sweep measured the same thing, cell by cell, whatever their cache keys.

    python scripts/same_figures.py OLD_OUTPUT_FOLDER NEW_OUTPUT_FOLDER     (e.g. outputs/demo of two clones)

A cell is known by what it measures (draft, test set, τ_dec, estimator, γ, batch size, ε, lenience), not by
its key, so a change of the key recipe (a new format version) still compares. Every metric is compared
exactly, except those computed from a wall time (the cost ratio c and the modelled speedup that uses it,
timed again in every run); each distilled draft's weights are compared tensor by tensor. Prints one line
per difference and a summary; exits 1 when anything differs or either folder lacks a cell the other has.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from safetensors.numpy import load_file

# computed from wall times: timed again on every run, so never equal
TIMED = ("seconds", "speedup", "cost_terms", "tokens_per_s")
IDENTITY = ("draft", "test_set", "tau_dec", "estimator", "gamma", "batch_size", "epsilon", "lenience")


def _timed(name: str) -> bool:
    return name.startswith(TIMED) or "seconds" in name


def _cells(folder: Path) -> dict[tuple, dict]:
    cells = {}
    for path in sorted((folder / "cells").glob("*.json")):
        record = json.loads(path.read_text())
        cells[tuple(record.get(name) for name in IDENTITY)] = record["metrics"]
    return cells


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def compare_cells(old: Path, new: Path) -> tuple[list[str], int, int]:
    """Differences, cells compared, metrics compared."""
    before, after = _cells(old), _cells(new)
    problems = [f"cell {cell}: only in {old}" for cell in sorted(set(before) - set(after), key=str)]
    problems += [f"cell {cell}: only in {new}" for cell in sorted(set(after) - set(before), key=str)]
    compared = 0
    for cell in sorted(set(before) & set(after), key=str):
        names = {n for n in before[cell].keys() | after[cell].keys() if not _timed(n)}
        for name in sorted(names):
            compared += 1
            if not _same(before[cell].get(name), after[cell].get(name)):
                problems.append(
                    f"cell {cell}: {name} {before[cell].get(name)!r} -> {after[cell].get(name)!r}"
                )
    return problems, len(set(before) & set(after)), compared


def compare_drafts(old: Path, new: Path) -> tuple[list[str], int]:
    """Differences in the distilled drafts' weights (by draft folder name), drafts compared."""
    problems, compared = [], 0
    weights = {p.parent.name: p for p in (old / "drafts").glob("*/model.safetensors")}
    for name, path in sorted(weights.items()):
        other = new / "drafts" / name / "model.safetensors"
        if not other.is_file():
            problems.append(f"draft {name}: no weights in {new}")
            continue
        a, b = load_file(path), load_file(other)
        compared += 1
        if a.keys() != b.keys() or any(a[k].shape != b[k].shape or (a[k] != b[k]).any() for k in a):
            problems.append(f"draft {name}: weights differ")
    return problems, compared


def main(old: Path, new: Path) -> int:
    cell_problems, cells, metrics = compare_cells(old, new)
    draft_problems, drafts = compare_drafts(old, new)
    for line in cell_problems + draft_problems:
        print(line)
    print(
        f"{cells} cells ({metrics} untimed metrics) and {drafts} drafts' weights compared: "
        f"{len(cell_problems)} cell and {len(draft_problems)} draft differences"
    )
    return 1 if cell_problems or draft_problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
