"""The seed formulas are pinned: a changed formula changes every sampled row under unchanged cache keys."""

from __future__ import annotations

import subprocess
import sys

from specray.seeds import decode_seed, derive_seed, prompt_seed, request_seed


def test_hashed_seeds_are_pinned() -> None:
    assert request_seed(7, "synthetic-0-1", 0.5) == 1053368095010274991
    assert request_seed(0, "p", 1) == request_seed(0, "p", 1.0) == 6232142713275608747  # τ as a float
    assert derive_seed(3, "student", 2, 1, 0) == 6232202186395204808
    assert derive_seed(0, "tau_kd") == 4059243511802713944
    assert derive_seed(5, "epoch", 0.7, 1) == 3828503352419758806


def test_indexed_seeds_are_pinned() -> None:
    assert prompt_seed(2, 5) == 2 * 1_000_003 + 5
    assert decode_seed(2, 5, 3) == 2 * 1_000_003 + 5 * 1_009 + 3


def test_seeds_import_nothing_heavy() -> None:
    code = "import sys, specray.seeds; print(sorted({'torch', 'numpy', 'ray'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
