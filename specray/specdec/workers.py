"""The evaluation pool: Ray actors that each load the target once and take passes from a queue.

Each actor wraps one `Evaluator` (the whole evaluation runs without Ray in that class). The driver keeps
the queue of passes (`cells.passes`: the analytic cells of several drafts at one (test set, τ_dec), or one
empirical cell): it hands each idle actor the next pass, and when an actor dies mid-pass the pass goes back
on the queue and a fresh actor replaces the dead one, so every cell's record is produced exactly once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import RayActorError

from specray.faults import Faults
from specray.keys import device_kind
from specray.progress import bar
from specray.specdec.evaluator import Evaluator
from specray.specdec.records import CellRecord, CostRatio, EvalJob, EvalSettings

log = logging.getLogger(__name__)

Pass = tuple[EvalJob, ...]


@ray.remote
class EvalWorker:
    """Thin actor: load the target once, evaluate passes, close."""

    def __init__(
        self,
        target_path: str,
        prompts: dict,
        settings: EvalSettings,
        threads: int,
        device: str,
        faults: Faults | None = None,
        **model_kwargs,
    ):
        import torch

        torch.set_num_threads(threads)
        # Ray sets CUDA_VISIBLE_DEVICES to the GPUs it assigned: the actor's GPU is cuda:0 in here
        where = "cuda:0" if device == "cuda" else "cpu"
        self.evaluator = Evaluator(target_path, prompts, settings, device=where, **model_kwargs)
        self.faults, self.cells = faults or Faults(), 0

    def evaluate(self, jobs: Pass, cost_ratio: float | None) -> list[CellRecord]:
        evaluator = self.evaluator
        evaluator.settings = replace(evaluator.settings, cost_ratio=cost_ratio)
        records = evaluator.evaluate(jobs)
        self.cells += 1
        self.faults.check("eval.cell", self.cells)  # fault injection (specray/faults.py)
        return records

    def measure_cost_ratio(self, draft_path: str) -> CostRatio:
        return self.evaluator.measure_cost_ratio(draft_path)

    def close(self) -> None:
        self.evaluator = None


class EvalPool:
    """N `EvalWorker` replicas with the spec's resources; `run` evaluates a list of passes."""

    def __init__(
        self,
        target_path: str,
        prompts: dict[str, list[list[int]]],
        settings: EvalSettings,
        replicas: int = 1,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        max_retries: int = 3,
        **model_kwargs: Any,
    ):
        self._options = {"num_cpus": num_cpus, "num_gpus": num_gpus}
        device = device_kind(num_gpus)
        self._args = (target_path, prompts, settings, max(1, int(num_cpus)), device, Faults.from_env())
        self._model_kwargs = model_kwargs
        self.cost_ratio = settings.cost_ratio
        self.max_retries = max_retries
        self.actors = [self._new_actor() for _ in range(replicas)]

    def _new_actor(self) -> ray.actor.ActorHandle:
        return EvalWorker.options(**self._options).remote(*self._args, **self._model_kwargs)

    def measure_cost_ratio(self, draft_path: str) -> CostRatio:
        """c on one actor (where the cells run); every later analytic cell uses it."""
        measured = ray.get(self.actors[0].measure_cost_ratio.remote(draft_path))
        self.cost_ratio = measured.value
        return measured

    def run(
        self,
        passes: Sequence[Pass],
        on_result: Callable[[list[CellRecord]], None] | None = None,
        show_progress: bool = True,
    ) -> list[CellRecord]:
        """Evaluate every pass once; returns the records in the order of the passes' jobs. `on_result` sees
        each pass's records as soon as they arrive (the sweep saves them there: a killed driver loses no
        finished cell)."""
        queue, idle = deque(passes), list(self.actors)
        in_flight: dict[ray.ObjectRef, tuple[Pass, ray.actor.ActorHandle]] = {}
        done: dict[int, list[CellRecord]] = {}
        failures: dict[int, int] = {}
        total = sum(len(unit) for unit in passes)
        with bar(total, "eval", "cell", enabled=show_progress) as meter:
            while queue or in_flight:
                while queue and idle:
                    unit, actor = queue.popleft(), idle.pop()
                    in_flight[actor.evaluate.remote(unit, self.cost_ratio)] = (unit, actor)
                (ref,), _ = ray.wait(list(in_flight), num_returns=1)
                unit, actor = in_flight.pop(ref)
                try:
                    records = ray.get(ref)
                except RayActorError as error:
                    idle.append(self._replace(actor, unit, failures, error))
                    queue.appendleft(unit)
                    continue
                done[id(unit)] = records
                idle.append(actor)
                meter.update(len(records))
                if on_result is not None:
                    on_result(records)
        return [record for unit in passes for record in done[id(unit)]]

    def _replace(self, dead: ray.actor.ActorHandle, unit: Pass, failures: dict[int, int], error: Exception):
        failures[id(unit)] = failures.get(id(unit), 0) + 1
        if failures[id(unit)] > self.max_retries:
            raise RuntimeError(
                f"eval pass {unit[0].label} (+{len(unit) - 1} cells) failed {self.max_retries + 1} times; "
                f"last error: {error}"
            )
        log.warning("eval actor died during %s (%s); retrying the pass on a new actor", unit[0].label, error)
        fresh = self._new_actor()
        self.actors[self.actors.index(dead)] = fresh
        return fresh

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    def __enter__(self) -> EvalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
