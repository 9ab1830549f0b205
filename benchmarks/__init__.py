"""Reproducible measurements that print ratios, grouped by what they measure (benchmarks/README.md).

Each benchmark is a module run from the repository root, `python -m benchmarks.<group>.<name>`, so the
packages import each other and specray by their names, with no path edits. `quick.py` is the quick mode they
share (a micro zoo and a few rows: what CI runs).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the repository root: sweeps/, data/, docs/results/
