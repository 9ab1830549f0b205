"""One start-up for every driver (`specray run`, `specray tune`, `specray garden`): what each does, in this
order, before an MLflow run is created or Ray starts.

1. the driver's own checks of the spec (`check_tune`, `check_garden`; a sweep has none beyond the spec's);
2. the output folder is writable, then held for the whole run (`locks.output_folder`: a second run on it
   is refused at once);
3. the plan (`plan_sweep`: splits, prompt sets, shard and draft keys — every key the run will use);
4. the preflight (`preflight.py`: cache writable, models loadable, one vocabulary, the chat template).

`--dry-run` (`dry_run`) does 1 and 3 and surveys what is on disk (`survey.py`): what would be reused and
what computed, without the lock, the preflight's model loading, MLflow or Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from specray.config import SweepSpec
from specray.files import check_writable
from specray.locks import output_folder
from specray.sweep.plan import SweepPlan, plan_sweep, sweep_dir
from specray.sweep.preflight import preflight
from specray.sweep.survey import Survey, survey

Check = Callable[[SweepSpec], None]


@contextmanager
def started(spec: SweepSpec, check: Check | None = None, validation: bool = False) -> Iterator[SweepPlan]:
    """Checks, lock, plan, preflight (in that order); the plan, with the output folder held until the
    block ends. `validation`: also the validation prompts (a tune search scores on them)."""
    if check is not None:
        check(spec)
    check_writable(sweep_dir(spec), "output_dir", "choose another with output_dir=PATH")
    with output_folder(sweep_dir(spec)):
        plan = plan_sweep(spec, validation=validation)
        preflight(spec)
        yield plan


def dry_run(
    spec: SweepSpec, check: Check | None = None, validation: bool = False
) -> tuple[SweepPlan, Survey]:
    """What `--dry-run` prints: the plan and what of it is on disk already."""
    if check is not None:
        check(spec)
    plan = plan_sweep(spec, validation=validation)
    return plan, survey(plan)
