"""Rewrite every figure the docs quote from docs/results/*.json: the results blocks and the inline figures
of README.md, docs/ and benchmarks/README.md (`specray/cli/results.py` says how pages quote them).

Run it after a results file changed, e.g. after `make record-demo`:
    .venv/bin/python scripts/results.py
"""

from __future__ import annotations

from pathlib import Path

from specray.cli.results import load_results, rendered

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    results = load_results(REPO / "docs" / "results")
    pages = [REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        new = rendered(text, results)
        if new != text:
            page.write_text(new)
            print(f"rewrote {page.relative_to(REPO)}")


if __name__ == "__main__":
    main()
