"""The one resource check shared by the teacher pool, the eval pool and Ray Train (no Ray started)."""

from __future__ import annotations

import pytest

from specray.cluster.actors import Demand, check_fits
from specray.devices import Resources
from specray.errors import SpecError

TEACHER = ("teacher.replicas", "teacher.num_cpus", "teacher.num_gpus")


def test_a_demand_that_fits_passes_and_one_that_does_not_names_its_fields() -> None:
    check_fits(Demand(2, Resources(1.0), TEACHER), {"CPU": 2.0})
    check_fits(Demand(4, Resources(0.5, 0.25), TEACHER), {"CPU": 2.0, "GPU": 1.0})  # fractions add up
    with pytest.raises(SpecError) as cpus:
        check_fits(Demand(3, Resources(1.0), TEACHER), {"CPU": 2.0})
    assert str(cpus.value) == (
        "teacher.replicas x teacher.num_cpus = 3 CPUs, but the local Ray has 2; "
        "lower teacher.replicas or teacher.num_cpus (or raise ray.num_cpus)"
    )
    workers = ("distill.workers", "distill.num_cpus_per_worker", "distill.num_gpus_per_worker")
    with pytest.raises(SpecError) as gpus:
        check_fits(Demand(2, Resources(1.0, 1.0), workers), {"CPU": 8.0})  # no GPU key: none
    assert str(gpus.value) == (
        "distill.workers x distill.num_gpus_per_worker = 2 GPUs, but the local Ray has 0; "
        "lower distill.workers or distill.num_gpus_per_worker"
    )


def test_a_user_error_inside_an_actor_reaches_the_user_as_its_own_one_line_message() -> None:
    from ray.exceptions import RayTaskError

    from specray.cluster.actors import _user_error
    from specray.errors import ModelError, ray_cause

    cause = ModelError("drafts/online__tau_kd=0.6/model.safetensors: unreadable (truncated or corrupt)")
    wrapped = RayTaskError(
        "EvalWorker.evaluate",
        "Traceback (most recent call last):\n  ...\nModelError: unreadable",
        cause,
        proctitle="ray::EvalWorker.evaluate()",
        pid=4242,
        ip="127.0.0.1",
        actor_repr="<specray.specdec.workers.EvalWorker object at 0x7f>",
        actor_id="abc123",
    ).as_instanceof_cause()
    assert isinstance(wrapped, ModelError) and "pid=4242" in str(wrapped)  # what a user saw before
    assert ray_cause(wrapped) is cause and _user_error(wrapped) is cause
    assert str(_user_error(wrapped)) == str(cause)
    assert ray_cause(cause) is cause  # an error not from Ray is left as it is
    bug = RayTaskError("EvalWorker.evaluate", "Traceback ...", ZeroDivisionError("x")).as_instanceof_cause()
    assert _user_error(bug) is bug  # a bug keeps Ray's traceback
