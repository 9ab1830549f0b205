"""The chaos run's fault schedule: which faults, in which stage of the sweep, after how long — drawn from a
seeded RNG, so a seed always gives the same schedule (the moments the kills land still depend on how fast
the machine runs the sweep).

Fault kinds: `teacher` (a teacher replica), `train` (a Ray Train worker), `eval` (an eval actor) — each
SIGKILLed in its own stage; `node` (the worker node, every process of it: a lost machine; a replacement
joins); `driver` (`specray run`, SIGKILL; the supervisor re-runs the command); `ray` (every process of
the cluster, as `ray stop --force` would; the supervisor starts the cluster again and re-runs the command).

Phases, in the order a sweep passes them: `start` (the driver is up, no actor yet), `teacher`, `distill`,
`eval` (their actors are up), `report` (the cells are done, the driver writes the report and MLflow's
records). A fault waits for its phase, then for its delay, then strikes.

One rule keeps the schedule inside what the sweep promises to survive: specray's pools give up on a unit
lost four times, and Ray Train on a run whose workers failed four times (`cluster.actors.MAX_RETRIES`,
`distill.ray_train.MAX_FAILURES`: a crash that follows the work must not loop forever). So between two
restarts (a driver or Ray fault, which start every pool afresh) a phase takes at most MAX_POOL_FAULTS
faults that strike its actors (`teacher`, `train`, `eval`, `node`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

KINDS = ("teacher", "train", "eval", "node", "driver", "ray")
PHASES = ("start", "teacher", "distill", "eval", "report")
STAGE = {"teacher": "teacher", "train": "distill", "eval": "eval"}  # kinds that strike one stage's actors
WHERE = {  # phases the other kinds are drawn into
    "node": ("teacher", "distill", "eval"),
    "driver": PHASES,
    "ray": ("teacher", "distill", "eval"),
}
RESTARTS = ("driver", "ray")
MAX_POOL_FAULTS = 3


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: `kind` strikes `delay_s` seconds after its `phase` is reached; `pick` chooses
    among the targets found then (index modulo their number, in pid order)."""

    kind: str
    phase: str
    delay_s: float
    pick: int

    def line(self) -> str:
        return f"{self.kind:8s} in {self.phase:8s} after {self.delay_s:4.1f}s (pick {self.pick})"


def draw_schedule(seed: int, counts: dict[str, int], max_delay_s: dict[str, float]) -> list[Fault]:
    """`counts[kind]` faults of each kind, in phase order; `max_delay_s[phase]` bounds the delays drawn.
    Raises ValueError when the restarts are too few to keep MAX_POOL_FAULTS per phase and restart."""
    rng = random.Random(seed)
    pool: dict[str, list[str]] = {phase: [] for phase in PHASES}
    for kind in ("teacher", "train", "eval", "node"):
        for _ in range(counts.get(kind, 0)):
            pool[STAGE.get(kind) or rng.choice(WHERE[kind])].append(kind)
    restarts = [kind for kind in RESTARTS for _ in range(counts.get(kind, 0))]
    rng.shuffle(restarts)
    needed = {phase: max(0, math.ceil(len(kinds) / MAX_POOL_FAULTS) - 1) for phase, kinds in pool.items()}
    if sum(needed.values()) > len(restarts):
        raise ValueError(f"{sum(needed.values())} restarts needed between pool faults, {len(restarts)} drawn")
    own: dict[str, list[str]] = {phase: [restarts.pop() for _ in range(n)] for phase, n in needed.items()}
    for kind in restarts:  # the rest land anywhere their kind may
        own[rng.choice(WHERE[kind])].append(kind)
    schedule = []
    for phase in PHASES:
        kinds = _interleave(rng, pool[phase], own[phase])
        schedule += [
            Fault(k, phase, round(rng.uniform(0.2, max_delay_s[phase]), 1), rng.randrange(1000))
            for k in kinds
        ]
    return schedule


def _interleave(rng: random.Random, pool: list[str], restarts: list[str]) -> list[str]:
    """The pool faults in chunks of at most MAX_POOL_FAULTS, a restart between chunks, the remaining
    restarts anywhere (a restart never breaks the rule)."""
    rng.shuffle(pool)
    rng.shuffle(restarts)
    chunks = [pool[i : i + MAX_POOL_FAULTS] for i in range(0, len(pool), MAX_POOL_FAULTS)]
    order: list[str] = []
    for i, chunk in enumerate(chunks):
        order += chunk
        if i < len(chunks) - 1:
            order.append(restarts.pop())
    for kind in restarts:
        order.insert(rng.randrange(len(order) + 1), kind)
    return order
