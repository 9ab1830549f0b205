"""Names that several stages write and read back, so that each is spelled once.

Import-light (no torch, no Ray, no MLflow): the plan, the report, the export and the CLI all use it.
"""

from __future__ import annotations

BASELINE = "non-distill"  # the draft as it is, un-distilled: every distilled draft is compared with it
