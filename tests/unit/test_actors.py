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
