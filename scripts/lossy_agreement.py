"""Analytic vs empirical acceptance, cell by cell, for a sweep's saved cell records (lossy ones included).

    python scripts/lossy_agreement.py OUTPUT_DIR

Pairs every empirical cell with the analytic cell of the same (draft, test set, τ_dec, lenience, ε) and
checks that the analytic acceptance on the empirical cells' prompts (`empirical_prompts_acceptance_rate`)
lies inside the empirical cell's 95% interval; prints one line per pair and the count inside.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(root: Path) -> None:
    cells = {}
    for path in root.glob("**/cells/*.json"):
        r = json.loads(path.read_text())
        cells[r["draft"], r["test_set"], r["tau_dec"], r["lenience"], r["epsilon"], r["estimator"]] = r
    inside = total = 0
    for (draft, test_set, tau, function, epsilon, estimator), record in sorted(cells.items(), key=str):
        analytic = cells.get((draft, test_set, tau, function, epsilon, "analytic"))
        if estimator != "empirical" or analytic is None:
            continue
        m = record["metrics"]
        value = analytic["metrics"]["empirical_prompts_acceptance_rate"]
        ok = abs(value - m["acceptance_rate"]) <= m["acceptance_rate_ci95"]
        inside, total = inside + ok, total + 1
        print(
            f"{draft:22s} {test_set} τ_dec={tau:g} {function or 'lossless':8s} ε={epsilon:<5g} "
            f"analytic {value:.4f}  empirical {m['acceptance_rate']:.4f} ± {m['acceptance_rate_ci95']:.4f}  "
            + ("inside" if ok else "OUTSIDE")
        )
    print(f"{inside}/{total} inside the empirical 95% interval")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
