"""The local Ray that `ray_session` starts: Train runs with the local settings unless a user set them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specray.cluster.runtime import LOCAL_TRAIN_ENV, ray_session, train_env_seen_by_a_worker
from specray.config import RaySpec

pytestmark = pytest.mark.integration
INTERVAL, WATCHER = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


def test_a_local_ray_trains_with_the_local_settings_and_a_users_own_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(WATCHER, raising=False)
    monkeypatch.setenv(INTERVAL, "1.5")  # the user's own
    with ray_session(RaySpec(num_cpus=2)):
        seen = train_env_seen_by_a_worker(tmp_path)
    assert seen == {INTERVAL: "1.5", WATCHER: LOCAL_TRAIN_ENV[WATCHER]}
    assert os.environ[INTERVAL] == "1.5" and WATCHER not in os.environ  # the driver's environment as it was
