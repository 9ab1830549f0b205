"""The evaluation pool: Ray actors that each load the target once and take cells from a queue.

Each actor wraps one `Evaluator` (the whole evaluation runs without Ray in that class). The driver keeps
the queue: it hands each idle actor the next cell, and when an actor dies mid-cell the cell goes back on the
queue and a fresh actor replaces the dead one, so every cell's record is produced exactly once. Cells are
queued grouped by (test set, τ_dec) so an actor's cached target pass serves every draft of that group.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError
from tqdm.auto import tqdm

from specray.faults import Faults
from specray.specdec.evaluator import EvalJob, EvalSettings, Evaluator

log = logging.getLogger(__name__)


@ray.remote
class EvalWorker:
    """Thin actor: load the target once, evaluate cells, close."""

    def __init__(
        self,
        target_path: str,
        prompts: dict,
        settings: EvalSettings,
        threads: int,
        faults: Faults | None = None,
        **model_kwargs,
    ):
        import torch

        torch.set_num_threads(threads)
        self.evaluator = Evaluator(target_path, prompts, settings, **model_kwargs)
        self.faults, self.cells = faults or Faults(), 0

    def evaluate(self, job: EvalJob) -> dict[str, Any]:
        record = self.evaluator.evaluate(job)
        self.cells += 1
        self.faults.check("eval.cell", self.cells)  # fault injection (specray/faults.py)
        return record

    def close(self) -> None:
        self.evaluator = None


class EvalPool:
    """N `EvalWorker` replicas with the spec's resources; `run` evaluates a list of cells."""

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
        self._args = (target_path, prompts, settings, max(1, int(num_cpus)), Faults.from_env())
        self._model_kwargs = model_kwargs
        self.max_retries = max_retries
        self.actors = [self._new_actor() for _ in range(replicas)]

    def _new_actor(self) -> ray.actor.ActorHandle:
        return EvalWorker.options(**self._options).remote(*self._args, **self._model_kwargs)

    def run(
        self,
        jobs: Sequence[EvalJob],
        on_result: Callable[[dict[str, Any]], None] | None = None,
        show_progress: bool = True,
    ) -> list[dict[str, Any]]:
        """Evaluate every job once; returns records in the order of `jobs`. `on_result` sees each record
        as soon as it arrives (the sweep saves it there, so a killed driver loses no finished cell)."""
        ordered = sorted(jobs, key=lambda j: (j.test_set, j.tau_dec, j.estimator, j.draft))
        queue, idle = deque(ordered), list(self.actors)
        in_flight: dict[ray.ObjectRef, tuple[EvalJob, ray.actor.ActorHandle]] = {}
        records: dict[str, dict[str, Any]] = {}
        failures: dict[str, int] = {}
        with tqdm(total=len(ordered), desc="eval cells", unit="cell", disable=not show_progress) as bar:
            while queue or in_flight:
                while queue and idle:
                    job, actor = queue.popleft(), idle.pop()
                    in_flight[actor.evaluate.remote(job)] = (job, actor)
                (ref,), _ = ray.wait(list(in_flight), num_returns=1)
                job, actor = in_flight.pop(ref)
                try:
                    record = ray.get(ref)
                except RayActorError as error:
                    idle.append(self._replace(actor, job, failures, error))
                    queue.appendleft(job)
                    continue
                records.setdefault(job.key, record)
                idle.append(actor)
                bar.update()
                if on_result is not None:
                    on_result(record)
        return [records[job.key] for job in jobs]

    def _replace(self, dead: ray.actor.ActorHandle, job: EvalJob, failures: dict[str, int], error: Exception):
        failures[job.key] = failures.get(job.key, 0) + 1
        if failures[job.key] > self.max_retries:
            raise RuntimeError(
                f"eval cell {job.key} failed {self.max_retries + 1} times; last error: {error}"
            )
        log.warning("eval actor died during %s (%s); retrying the cell on a new actor", job.key, error)
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
