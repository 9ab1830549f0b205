"""The local Ray that `ray_session` starts: Train runs with the local settings unless a user set them, and
specray's runs on it start no autoscaling coordinator."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray
import ray.train

from specray.cluster.runtime import LOCAL_TRAIN_ENV, ray_session, started_here, train_env_seen_by_a_worker
from specray.config import RaySpec
from specray.distill.ray_2_60 import torch_trainer

pytestmark = pytest.mark.integration
INTERVAL, WATCHER = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
COORDINATOR = "AutoscalingCoordinator"  # Ray Data's detached actor that Train's scaling policy starts


def _coordinator_running() -> bool:
    return any(actor["name"] == COORDINATOR for actor in ray.util.list_named_actors(all_namespaces=True))


def _touch(config: dict) -> None:
    Path(config["file"]).touch()


def test_a_local_ray_trains_with_the_local_settings_and_a_users_own_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(WATCHER, raising=False)
    monkeypatch.setenv(INTERVAL, "1.5")  # the user's own
    with ray_session(RaySpec(num_cpus=2)):
        assert started_here()
        # a specray run on the local Ray: no autoscaling request, so no coordinator
        torch_trainer(
            _touch,
            local_ray=started_here(),
            train_loop_config={"file": str(tmp_path / "ran")},
            scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
            run_config=ray.train.RunConfig(storage_path=str(tmp_path / "lean_run")),
        ).fit()
        assert (tmp_path / "ran").is_file() and not _coordinator_running()
        seen = train_env_seen_by_a_worker(tmp_path)  # Train's own trainer: its policy starts one
        assert _coordinator_running()
    assert not started_here()
    assert seen == {INTERVAL: "1.5", WATCHER: LOCAL_TRAIN_ENV[WATCHER]}
    assert os.environ[INTERVAL] == "1.5" and WATCHER not in os.environ  # the driver's environment as it was
