"""The local Ray that `ray_session` starts: Train runs with the local settings unless a user set them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import ray.train
from ray.train.torch import TorchTrainer

from specray.cluster.runtime import LOCAL_TRAIN_ENV, ray_session
from specray.config import RaySpec

pytestmark = pytest.mark.integration
INTERVAL, WATCHER = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


def _seen_by_a_train_worker(folder: Path) -> dict[str, str]:
    """The settings as a Ray Train worker reads them (the controller hands on what it got)."""
    seen = folder / "seen.json"

    def read(config: dict) -> None:
        Path(config["file"]).write_text(json.dumps({n: os.environ.get(n, "unset") for n in LOCAL_TRAIN_ENV}))

    TorchTrainer(
        read,
        train_loop_config={"file": str(seen)},
        scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(storage_path=str(folder / "ray")),
    ).fit()
    return json.loads(seen.read_text())


def test_a_local_ray_trains_with_the_local_settings_and_a_users_own_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(WATCHER, raising=False)
    monkeypatch.setenv(INTERVAL, "1.5")  # the user's own
    with ray_session(RaySpec(num_cpus=2)):
        seen = _seen_by_a_train_worker(tmp_path)
    assert seen == {INTERVAL: "1.5", WATCHER: LOCAL_TRAIN_ENV[WATCHER]}
    assert os.environ[INTERVAL] == "1.5" and WATCHER not in os.environ  # the driver's environment as it was
