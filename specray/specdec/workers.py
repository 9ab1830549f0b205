"""The evaluation pool: Ray actors that each load the target once and take passes from a queue.

Each actor wraps one `Evaluator` (the whole evaluation runs without Ray in that class), on the device of its
resources (`specray/devices.py`: `eval.num_gpus` > 0 → the GPU Ray assigned). The actors are a
`cluster.actors.Replicas`: the driver keeps the queue of passes (`cells.passes`: the analytic cells of
several drafts at one (test set, τ_dec), or one empirical cell) and hands each actor that is up the next
pass; when an actor is lost mid-pass, the pass goes back on the queue and a fresh actor replaces the lost
one, so every cell's record is produced exactly once (the one retry policy, `cluster/actors.py`). `c` is
measured on one of these actors: where the cells run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import ray

from specray.cluster.actors import Demand, LoadError, Replicas, check_local_fits
from specray.devices import Resources
from specray.faults import Faults
from specray.progress import bar
from specray.specdec.evaluator import Evaluator
from specray.specdec.garden_points import GardenPoint, measure_point
from specray.specdec.records import CellRecord, EvalJob, EvalSettings, StepCosts

if TYPE_CHECKING:
    from specray.config import SweepSpec
    from specray.data.examples import Example

log = logging.getLogger(__name__)

Pass = tuple[EvalJob, ...]


class EvalWorker:
    """Thin actor: load the target once (on its resources' device), evaluate passes, close."""

    def __init__(
        self,
        target_path: str,
        prompts: dict,
        settings: EvalSettings,
        resources: Resources,
        faults: Faults | None = None,
        model_kwargs: dict[str, Any] | None = None,
    ):
        self.faults, self.cells = faults or Faults(), 0
        self.load_error = LoadError()
        self.evaluator = self.load_error.load(
            lambda: Evaluator(
                target_path, prompts, settings, device=str(resources.enter()), **(model_kwargs or {})
            )
        )

    def ready(self) -> dict[str, Any]:
        self.load_error.check()
        assert self.evaluator is not None
        return {"pid": os.getpid(), "device": self.evaluator.device}

    def evaluate(self, jobs: Pass, step_costs: StepCosts | None) -> list[CellRecord]:
        evaluator = self.evaluator
        assert evaluator is not None, "evaluate before a successful ready()"
        evaluator.settings = replace(evaluator.settings, step_costs=step_costs)
        records = evaluator.evaluate(jobs)
        self.cells += 1
        self.faults.check("eval.cell", self.cells)  # fault injection (specray/faults.py)
        return records

    def measure_step_costs(self, draft_path: str, batch_sizes: list[int], gammas: list[int]) -> StepCosts:
        assert self.evaluator is not None, "measure_step_costs before a successful ready()"
        return self.evaluator.measure_step_costs(draft_path, batch_sizes, gammas)

    def close(self) -> None:
        self.evaluator = None


def eval_demand(spec: SweepSpec, replicas: int | None = None) -> Demand:
    """The eval actors' resources, from the spec: `eval.replicas` (or `replicas`) actors of `eval.num_cpus`
    CPUs and `eval.num_gpus` GPUs each; their device follows (`Resources.device`)."""
    e = spec.eval
    count = e.replicas if replicas is None else replicas
    return Demand(
        count, Resources(e.num_cpus, e.num_gpus), ("eval.replicas", "eval.num_cpus", "eval.num_gpus")
    )


def make_eval_pool(
    spec: SweepSpec,
    target_path: str,
    prompts: dict[str, list[list[int]]],
    settings: EvalSettings,
    *,
    replicas: int | None = None,
    target_id: str | None = None,
    examples: dict[str, list[Example]] | None = None,
) -> EvalPool:
    """The sweep's eval pool (`eval_demand`), refused first when a local Ray can never place it (Ray must
    be initialised). `examples`: the test sets' examples, to score the quality of decoded outputs."""
    demand, target = eval_demand(spec, replicas), spec.models.target
    if spec.ray.address is None:  # a remote cluster may autoscale; a local one never grows
        check_local_fits(demand)
    model: dict[str, Any] = {"dtype": target.dtype, "trust_remote_code": target.trust_remote_code}
    if target_id is not None:
        model["target_id"] = target_id
    if examples is not None:
        model["examples"] = examples
    return EvalPool(target_path, prompts, settings, demand.count, demand.each, **model)


class EvalPool:
    """N `EvalWorker` replicas, each reserving `resources` and computing on their device; `run` evaluates
    a list of passes."""

    def __init__(
        self,
        target_path: str,
        prompts: dict[str, list[list[int]]],
        settings: EvalSettings,
        replicas: int = 1,
        resources: Resources = Resources(1.0),
        max_retries: int = 3,
        **model_kwargs: Any,
    ):
        self.resources = resources
        args = (target_path, prompts, settings, self.resources, Faults.from_env(), model_kwargs)
        options = [self.resources.ray_options()] * replicas
        self.replicas = Replicas(ray.remote(EvalWorker), args, options, "eval", 1, max_retries)
        self.step_costs = settings.step_costs

    @property
    def actors(self) -> list[ray.actor.ActorHandle]:
        return self.replicas.actors

    def measure_step_costs(self, draft_path: str, batch_sizes: list[int], gammas: list[int]) -> StepCosts:
        """The step costs on an actor that is up (where the cells run); every later analytic cell uses
        them."""
        measured: list[StepCosts] = []
        self.replicas.run(
            [draft_path],
            lambda actor, path: actor.measure_step_costs.remote(path, batch_sizes, gammas),
            lambda _, costs: measured.append(costs),
            describe=lambda path: f"timing decoding steps against {path}",
        )
        self.step_costs = measured[0]
        return measured[0]

    def run(
        self,
        passes: Sequence[Pass],
        on_result: Callable[[list[CellRecord]], None] | None = None,
        show_progress: bool = True,
    ) -> list[CellRecord]:
        """Evaluate every pass once; returns the records in the order of the passes' jobs. `on_result` sees
        each pass's records as soon as they arrive (the sweep saves them there: a killed driver loses no
        finished cell)."""
        done: dict[int, list[CellRecord]] = {}
        total = sum(len(unit) for unit in passes)
        with bar(total, "eval", "cell", enabled=show_progress) as meter:

            def arrived(index: int, records: list[CellRecord]) -> None:
                done[index] = records
                meter.update(len(records))
                if on_result is not None:
                    on_result(records)

            self.replicas.run(
                passes,
                lambda actor, unit: actor.evaluate.remote(unit, self.step_costs),
                arrived,
                describe=lambda unit: f"eval pass {unit[0].label} (+{len(unit) - 1} cells)",
            )
        return [record for index in range(len(passes)) for record in done[index]]

    def close(self) -> None:
        self.replicas.close()

    def __enter__(self) -> EvalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PointWorker:
    """Thin actor of a model garden (`garden.run`): decodes one point at a time on its resources' device,
    keeping the last few models it loaded (consecutive points often share their target). `models` maps a
    model folder to its load settings (dtype, trust_remote_code)."""

    KEEP = 3  # models held at once: a point's target and draft, and the next point's target

    def __init__(
        self,
        tokenizer_path: str,
        prompts: list[list[int]],
        examples: list[Example],
        settings: EvalSettings,
        resources: Resources,
        models: dict[str, dict[str, Any]],
    ) -> None:
        from specray.models.loading import load_tokenizer

        self.load_error = LoadError()
        self.device = str(self.load_error.load(resources.enter))
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.prompts, self.examples, self.settings, self.models = prompts, examples, settings, models
        self.loaded: dict[str, Any] = {}

    def ready(self) -> dict[str, Any]:
        self.load_error.check()
        return {"pid": os.getpid(), "device": self.device}

    def _model(self, path: str) -> Any:
        from specray.models.loading import load_model

        if path not in self.loaded:
            if len(self.loaded) >= self.KEEP:
                self.loaded.pop(next(iter(self.loaded)))
            self.loaded[path] = load_model(path, device=self.device, **self.models.get(path, {}))
        return self.loaded[path]

    def measure(self, point: GardenPoint) -> dict[str, Any]:
        target = self._model(point.target)
        draft = self._model(point.draft) if point.draft is not None else None

        def text(tokens: list[int]) -> str:
            return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

        s = self.settings
        result = measure_point(
            point, target, draft, self.prompts, self.examples, text, s, self.tokenizer.eos_token_id
        )
        return result.to_json()


def measure_garden_points(
    spec: SweepSpec,
    points: Sequence[GardenPoint],
    tokenizer_path: str,
    prompts: list[list[int]],
    examples: list[Example],
    models: dict[str, dict[str, Any]],
    on_result: Callable[[int, dict[str, Any]], None],
) -> None:
    """Every point measured, one after another, on one actor of the eval resources (`eval_demand`): points
    never share the machine, so their latencies compare. `on_result(index, figures)` as each ends; a lost
    actor is replaced and its point measured again (`cluster.actors.Replicas`)."""
    demand = eval_demand(spec, replicas=1)
    if spec.ray.address is None:
        check_local_fits(demand)
    e = spec.eval
    settings = EvalSettings(e.repeats, e.max_new_tokens, e.empirical_prompts, e.seed)
    args = (tokenizer_path, prompts, examples, settings, demand.each, models)
    meter = Replicas(ray.remote(PointWorker), args, [demand.each.ray_options()], "garden", 1)
    try:
        meter.run(points, lambda actor, point: actor.measure.remote(point), on_result, lambda p: p.label)
    finally:
        meter.close()
