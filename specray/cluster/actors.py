"""One actor pool, one retry policy, one resource check: the teacher replicas and the eval actors are each a
`Replicas`, and the teacher pool, the eval pool and Ray Train's pre-check share `check_fits`.

The policy:
- **Resources.** Every actor of a pool reserves the same resources. On a local Ray (which never grows)
  `check_fits` refuses, before anything starts, a pool that can never be placed: an actor that cannot be
  placed waits forever, silently.
- **Work goes only to actors that are up.** An actor takes work once its `ready()` call has returned. A
  replacement Ray has not placed yet (a full cluster after a node loss) holds nothing: the work of the
  actor it replaces goes to the actors that are up. While no actor is up, the pool logs what it waits for
  every `WAIT_LOG_S` seconds and goes on waiting: an autoscaler or a new node brings room (docs/CLUSTER.md).
- **A lost actor is replaced, never restarted in place.** When a call fails because its actor died or its
  node became unreachable (`RayActorError`: `ActorDiedError`, `ActorUnavailableError`), the actor is killed
  for good, a fresh one starts in its slot with the same arguments and options, and every unit it held goes
  back to the front of the queue. A unit lost with its actor `max_retries` + 1 times fails the stage (a
  crash that follows the unit, e.g. out of memory on it, must not loop forever); so does a slot whose actor
  fails to come up `max_retries` + 1 times in a row.
- **Any other error fails the stage at once**: an exception raised by the unit's own code is a bug or bad
  input, not a lost machine; a user error (`errors.USER_ERRORS`) is re-raised as itself (one clear line).

Exactly once: the driver reads each unit's result once, from the attempt that succeeded (a lost attempt's
result is never read), and hands it to `on_result` as it arrives. A unit is re-run from scratch, so callers
keep units reproducible (the teacher's per-request seeds, the evaluator's deterministic cells).

Why not Ray's own restarts (`max_restarts` + `max_task_retries`): a restarting actor keeps the calls queued
on it, so on a full cluster they wait with it while the other actors idle, and until Ray declares a lost
node dead every retry fails fast (`ActorUnavailableError`) and spends a finite budget. Why not
`ray.util.ActorPool`: it has no notion of a lost actor (its bookkeeping loses the actor with the call).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import ray
from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError

from specray.devices import Resources
from specray.errors import USER_ERRORS, SpecError, find_cause, ray_cause

log = logging.getLogger(__name__)

MAX_RETRIES = 3  # losses of one unit (or failed starts of one slot) after the first, before the stage fails
WAIT_LOG_S = 60.0  # how often a pool with work but no actor up says what it waits for
LOST = (RayActorError, OutOfMemoryError)  # the actor's process or node is gone: replace it, re-run its units

Unit = TypeVar("Unit")
Loaded = TypeVar("Loaded")


@dataclass
class LoadError:
    """A user error met while an actor loads, kept and raised again from its `ready` call: Ray keeps a
    task error's type and message (the CLI shows one clear line), while an error raised in an actor's
    constructor reaches the driver as an opaque ActorDiedError."""

    error: Exception | None = None

    def load(self, load: Callable[[], Loaded]) -> Loaded | None:
        """`load()`, or None with the user error kept (any other error is raised: a bug, not bad input)."""
        try:
            return load()
        except USER_ERRORS as e:
            self.error = e
            return None

    def check(self) -> None:
        """Raise the kept error, if any (from the actor's `ready`)."""
        if self.error is not None:
            raise self.error


@dataclass(frozen=True)
class Demand:
    """`count` actors (or workers) reserving `each`, and the spec fields that set them, for the message:
    (count field, CPU field, GPU field), e.g. ("teacher.replicas", "teacher.num_cpus", "teacher.num_gpus")."""

    count: int
    each: Resources
    fields: tuple[str, str, str]


def check_fits(demand: Demand, available: Mapping[str, float]) -> None:
    """A SpecError naming the fields when `available` (Ray's cluster resources) can never host `demand`."""
    count_field, cpu_field, gpu_field = demand.fields
    for resource, field_name, each in (
        ("CPU", cpu_field, demand.each.num_cpus),
        ("GPU", gpu_field, demand.each.num_gpus),
    ):
        needed, have = demand.count * each, available.get(resource, 0.0)
        if needed > have:
            raise SpecError(
                f"{count_field} x {field_name} = {needed:g} {resource}s, but the local Ray has {have:g}; "
                f"lower {count_field} or {field_name}"
                + (" (or raise ray.num_cpus)" if resource == "CPU" else "")
            )


def check_local_fits(demand: Demand) -> None:
    """`check_fits` against the running (local) Ray: call it only where the cluster cannot grow."""
    check_fits(demand, ray.cluster_resources())


@dataclass
class _Slot:
    """One actor of the pool: its handle, its pending `ready()` call (None once up), what it holds."""

    options: dict[str, Any]
    actor: Any = None
    ready: Any = None
    info: Any = None  # what `ready()` returned
    held: int = 0
    failed_starts: int = 0


@dataclass
class _Pass(Generic[Unit]):
    """Driver-side state of one `run`: the queue of unit indices, the calls in flight, losses per unit."""

    units: Sequence[Unit]
    queue: deque[int]
    in_flight: dict[Any, tuple[int, _Slot]] = field(default_factory=dict)
    losses: Counter = field(default_factory=Counter)


class Replicas:
    """Actors of `actor_class`, one per entry of `options` (its Ray options), all built with `args`.

    `depth` calls at a time per actor (2: one runs while the next waits in its queue, so an actor never
    idles while the driver handles a result). The actor class must have `ready()`; it raises the error
    the constructor kept, if any (a constructor error would otherwise reach the driver as an opaque
    ActorDiedError)."""

    def __init__(
        self,
        actor_class: Any,
        args: tuple,
        options: Sequence[dict[str, Any]],
        name: str,
        depth: int = 1,
        max_retries: int = MAX_RETRIES,
    ) -> None:
        self.actor_class, self.args, self.name = actor_class, args, name
        self.depth, self.max_retries = depth, max_retries
        self.slots = [_Slot(dict(o)) for o in options]
        for slot in self.slots:
            self._start(slot)

    @property
    def actors(self) -> list[Any]:
        return [slot.actor for slot in self.slots]

    def _start(self, slot: _Slot) -> None:
        # no Ray restarts: a lost actor is replaced by the pool (module docstring)
        options = slot.options | {"max_restarts": 0, "max_task_retries": 0}
        slot.actor = self.actor_class.options(**options).remote(*self.args)
        slot.ready, slot.info, slot.held = slot.actor.ready.remote(), None, 0

    def _replace(self, slot: _Slot) -> None:
        ray.kill(slot.actor, no_restart=True)
        self._start(slot)

    def wait_until_up(self) -> list[Any]:
        """Block until every actor is up (replacing those that die starting); their `ready()` values."""
        while pending := {slot.ready: slot for slot in self.slots if slot.ready is not None}:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_LOG_S)
            if not done:
                log.warning(
                    "%s: %d actor(s) not placed yet; waiting for room on the cluster", self.name, len(pending)
                )
            for ref in done:
                self._settle_start(pending[ref])
        return [slot.info for slot in self.slots]

    def _settle_start(self, slot: _Slot) -> None:
        """The outcome of a slot's `ready()` call: up, replaced (it died starting), or a raised error."""
        try:
            slot.info, slot.ready, slot.failed_starts = ray.get(slot.ready), None, 0
        except LOST as error:
            slot.failed_starts += 1
            if slot.failed_starts > self.max_retries:
                raise RuntimeError(
                    f"{self.name}: an actor failed to start {slot.failed_starts} times in a row; "
                    f"last error: {error}"
                ) from None
            log.warning("%s: an actor died while starting (%s); starting another", self.name, error)
            self._replace(slot)
        except RayTaskError as error:
            raise _user_error(error) from None

    def run(
        self,
        units: Sequence[Unit],
        call: Callable[[Any, Unit], Any],
        on_result: Callable[[int, Any], None],
        describe: Callable[[Unit], str] = str,
    ) -> None:
        """`call(actor, unit)` (an ObjectRef) once per unit on the actors that are up; `on_result(index,
        result)` for each unit as its result arrives, exactly once (see the module docstring)."""
        state: _Pass[Unit] = _Pass(units, deque(range(len(units))))
        while state.queue or state.in_flight:
            self._dispatch(state, call)
            starting = {slot.ready: slot for slot in self.slots if slot.ready is not None}
            done, _ = ray.wait([*state.in_flight, *starting], num_returns=1, timeout=WAIT_LOG_S)
            if not done:  # WAIT_LOG_S without any news
                if len(starting) == len(self.slots):
                    log.warning("%s: no actor is up; waiting for Ray to place %d", self.name, len(starting))
                continue
            (ref,) = done
            if ref in starting:
                self._settle_start(starting[ref])
            else:
                self._settle_call(state, ref, on_result, describe)

    def _dispatch(self, state: _Pass[Unit], call: Callable[[Any, Unit], Any]) -> None:
        """Fill the actors that are up, one unit each before any gets a second."""
        for level in range(self.depth):
            for slot in self.slots:
                if state.queue and slot.ready is None and slot.held <= level:
                    index = state.queue.popleft()
                    state.in_flight[call(slot.actor, state.units[index])] = (index, slot)
                    slot.held += 1

    def _settle_call(
        self, state: _Pass[Unit], ref: Any, on_result: Callable[[int, Any], None], describe: Callable
    ) -> None:
        index, slot = state.in_flight.pop(ref)
        try:
            result = ray.get(ref)
        except LOST as error:
            self._lose(state, slot, index, error, describe)
            return
        except RayTaskError as error:
            raise _user_error(error) from None
        slot.held -= 1
        on_result(index, result)

    def _lose(
        self, state: _Pass[Unit], slot: _Slot, index: int, error: Exception, describe: Callable
    ) -> None:
        """Put every unit the lost actor held back at the front of the queue, and replace the actor."""
        others = {ref: i for ref, (i, holder) in state.in_flight.items() if holder is slot}
        for ref in others:
            del state.in_flight[ref]  # its result, if one ever comes, is never read
        held = sorted([index, *others.values()])
        for i in held:
            state.losses[i] += 1
            if state.losses[i] > self.max_retries:
                raise RuntimeError(
                    f"{self.name}: {describe(state.units[i])} was lost with its actor "
                    f"{state.losses[i]} times; last error: {error}"
                ) from None
        state.queue.extendleft(reversed(held))
        log.warning(
            "%s: actor lost during %s (%s); its %d unit(s) go back on the queue and a new actor replaces it",
            self.name,
            describe(state.units[index]),
            error,
            len(held),
        )
        self._replace(slot)

    def close(self, release: str | None = None) -> None:
        """Kill every actor; first, if `release` names a method, call it on the actors that are up and wait
        (e.g. vLLM frees GPU memory in `close`)."""
        if release is not None:
            for ref in [getattr(slot.actor, release).remote() for slot in self.slots if slot.ready is None]:
                with contextlib.suppress(*LOST):  # lost since its last call: nothing left to release
                    ray.get(ref)
        for slot in self.slots:
            ray.kill(slot.actor, no_restart=True)


def _user_error(error: RayTaskError) -> BaseException:
    """A user error raised inside an actor, as the actor raised it (its one-line message, without Ray's
    header: logged at debug level); any other error as Ray raised it, traceback and all."""
    log.debug("error inside a Ray actor: %s", error)
    return find_cause(ray_cause(error), USER_ERRORS) or error
