"""Names that several stages write and read back, so that each is spelled once.

Import-light (no torch, no Ray, no MLflow): the plan, the report, the export and the CLI all use it.
"""

from __future__ import annotations

BASELINE = "non-distill"  # the draft as it is, un-distilled: every distilled draft is compared with it

TUNE_DIR = (
    "tune"  # a `specray tune` run's folder, inside its sweep's output folder (`<output_dir>/<name>/tune`)
)
# what a finished `specray tune` leaves in its report folder for the export (`<output_dir>/<name>/tune/
# report`, its parent run's `report` artifact): the drafts Table 3 compares, its cells' step costs, its spec
TUNE_REPORT = "report"
TUNE_STATE = "tune.json"  # the search's state file beside it: what marks a folder as a tune's
TUNE_DRAFTS, TUNE_STEP_COSTS, TUNE_SPEC = "drafts.json", "step_costs.json", "spec.yaml"
