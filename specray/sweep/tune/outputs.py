"""What a finished `specray tune` leaves in `<output_dir>/<name>/tune/report/` (also logged to its MLflow
parent run as the `report` artifact), and who reads it:

    report.md              Table 3 at the full budget with its intervals, the rank agreement, the
                           composition verdicts, and the search's own Table 3 (a results file reads its
                           verdict table: `specray/cli/results.py`)
    table3.csv, .md        Table 3 at the full budget (`specray report --tune` reads the CSV)
    table3_search.csv, .md Table 3 at the search budget, one training each: the search's own record
    rank.csv               each retrained recipe's validation objective at both budgets
    cells.json             the full-budget drafts' cells, with each one's recipe and replicate (the report's
                           two-level intervals and the export read them)
    cells_search.json      the search budget's cells
    trials.csv             every trial: status, mixture, objective
    drafts.json            the full-budget drafts Table 3 compares (`Draft.to_json`) and the parent run id:
                           the export's candidates
    step_costs.json, spec.yaml   what the export needs besides (the step costs the cells used, the spec)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from specray.config import SweepSpec
from specray.config.loading import dump_spec
from specray.draft import Draft, split_replicate
from specray.files import write_json, write_text
from specray.names import TUNE_DRAFTS, TUNE_SPEC, TUNE_STEP_COSTS
from specray.report.composition import Composition, composition_gains, control_gains
from specray.report.table3 import RankAgreement, table3_section
from specray.report.tables import TABLE3_FILE, TUNE_CELLS_FILE, TUNE_RANK_FILE, markdown_table
from specray.report.verdicts import verdict_frame
from specray.specdec.records import CellRecord, StepCosts


def cells_json(records: Sequence[CellRecord], recipes: dict[str, str]) -> list[dict[str, Any]]:
    """Flat cell rows with each draft's recipe and replicate (what `paired.prompt_cells` stacks)."""
    rows = []
    for record in records:
        recipe = recipes.get(record.draft, record.draft)
        replicate = split_replicate(record.draft)[1] if recipe != record.draft else 0
        rows.append(record.flat() | {"recipe": recipe, "replicate": replicate})
    return rows


def write_records(
    folder: Path, spec: SweepSpec, parent: str, drafts: Sequence[Draft], cost: StepCosts
) -> None:
    """The export's records: the drafts Table 3 compares, the step costs, the spec."""
    payload = {"parent_run_id": parent, "drafts": [draft.to_json() for draft in drafts]}
    write_json(folder / TUNE_DRAFTS, payload)
    write_json(folder / TUNE_STEP_COSTS, cost.to_json())
    write_text(folder / TUNE_SPEC, dump_spec(spec))


def write_tables(
    folder: Path,
    composition: Composition,
    rank: RankAgreement,
    search_table: tuple[pd.DataFrame, str],
    title: str,
) -> str:
    """Table 3 at both budgets, the rank agreement and report.md (returned: what the CLI prints)."""
    folder.mkdir(parents=True, exist_ok=True)
    composition.table3.to_csv(folder / TABLE3_FILE, index=False)
    rank.recipes.to_csv(folder / TUNE_RANK_FILE, index=False)
    frame, search_markdown = search_table
    frame.to_csv(folder / "table3_search.csv", index=False)
    write_text(folder / "table3_search.md", search_markdown)
    table = "\n".join(table3_section(composition, rank))
    write_text(folder / "table3.md", f"# {title}\n\n{table}\n")
    verdicts = markdown_table(verdict_frame(composition_gains(composition) + control_gains(composition)))
    sections = [f"# {title}\n", table, "## Composition verdicts\n", verdicts]
    sections += ["## The search's own record\n", search_markdown.replace("# ", "### ", 1)]
    markdown = "\n".join(sections) + "\n"
    write_text(folder / "report.md", markdown)
    return markdown


def write_cells(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    (folder / name).write_text(json.dumps(rows, indent=1))


CELLS_FILE, SEARCH_CELLS_FILE = TUNE_CELLS_FILE, "cells_search.json"
