"""The teacher pool on a real local Ray with tiny real models: faults, resume, reproducibility, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import ray

from specray.config import load_spec
from specray.data.dataset import build_splits
from specray.data.shards import MANIFEST_FILE, SHARD_FILE, is_complete, read_parts, read_shard
from specray.keys import shard_key
from specray.teacher.pool import make_teacher_pool
from specray.teacher.shards import generate_shards
from tests.conftest import REPO, micro_zoo_spec
from tests.waiting import CLI_TIMEOUT_S

pytestmark = pytest.mark.integration
SPECRAY = str(Path(sys.executable).parent / "specray")
MICRO_ZOO = "models.zoo=" + json.dumps(micro_zoo_spec().model_dump(mode="json"))
TEMPERATURES = [0.0, 1.0]


@pytest.fixture(scope="module")
def spec():
    overrides = [MICRO_ZOO, "teacher.replicas=2", "teacher.batch_size=4", "teacher.max_new_tokens=16"]
    return load_spec(REPO / "sweeps" / "smoke.yaml", overrides)


@pytest.fixture(scope="module")
def train(spec):
    return build_splits(spec.data)["train"][:24]


@pytest.fixture(scope="module")
def pool(spec, micro_zoo):
    ray.init("local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        with make_teacher_pool(spec.teacher, str(micro_zoo.target)) as teacher_pool:
            yield teacher_pool
    finally:
        ray.shutdown()


class Recording:
    """The real pool, recording every (τ, prompt) it delivers; `on_first` runs after the first batch."""

    def __init__(self, pool, on_first=None, stop_after: int | None = None) -> None:
        self.pool, self.on_first, self.stop_after = pool, on_first, stop_after
        self.delivered: Counter = Counter()
        self.batches = 0

    def generate(self, requests, on_results) -> None:
        def record(results) -> None:
            self.delivered.update((r.tau, r.prompt_id) for r in results)
            on_results(results)
            self.batches += 1
            if self.batches == 1 and self.on_first is not None:
                self.on_first()
            if self.stop_after is not None and self.batches >= self.stop_after:
                raise KeyboardInterrupt("interrupted by the test")

        self.pool.generate(requests, record)


def run(spec, train, root: Path, pool, seed: int = 0, temperatures=TEMPERATURES):
    keys = {tau: shard_key(spec, train, tau, 16, seed) for tau in temperatures}
    return generate_shards(spec, train, keys, pool=pool, root=root, show_progress=False)


def tables(spec, train, root: Path, seed: int = 0, temperatures=TEMPERATURES):
    return {tau: read_shard(shard_key(spec, train, tau, 16, seed), root) for tau in temperatures}


@pytest.fixture(scope="module")
def reference(spec, train, pool, tmp_path_factory):
    """A clean run: the rows every other run must reproduce exactly."""
    root = tmp_path_factory.mktemp("reference")
    reports = run(spec, train, root, pool)
    assert all(not r.cached and r.generated == len(train) for r in reports.values())
    return tables(spec, train, root)


def test_killing_a_replica_mid_generation_loses_and_duplicates_nothing(
    spec, train, pool, reference, tmp_path
):
    replica = pool.actors[0]
    pid = ray.get(replica.ready.remote())["pid"]
    # Each replica holds two batches (one running, one queued), so after the first batch comes back the
    # killed replica certainly has work in flight: it goes back on the queue, a new replica replaces it.
    recording = Recording(pool, on_first=lambda: ray.kill(replica, no_restart=True))
    run(spec, train, tmp_path, recording)

    expected = {(tau, example.id) for tau in TEMPERATURES for example in train}
    assert set(recording.delivered) == expected
    assert set(recording.delivered.values()) == {1}  # every prompt exactly once per temperature
    assert pool.actors[0] is not replica  # replaced in its slot, by a fresh process
    assert ray.get(pool.actors[0].ready.remote())["pid"] != pid
    for tau in TEMPERATURES:
        folder = tmp_path / shard_key(spec, train, tau, 16, 0).digest
        assert sorted(p.name for p in folder.iterdir()) == [MANIFEST_FILE, SHARD_FILE]  # no part, no temp
    assert tables(spec, train, tmp_path) == reference  # the retried batch reproduced the same rows


def test_an_interrupted_run_resumes_with_only_the_missing_prompts(spec, train, pool, reference, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run(spec, train, tmp_path, Recording(pool, stop_after=3))
    saved = {tau: read_parts(shard_key(spec, train, tau, 16, 0), tmp_path).num_rows for tau in TEMPERATURES}
    assert sum(saved.values()) == 3 * spec.teacher.batch_size
    assert not any(is_complete(shard_key(spec, train, tau, 16, 0), tmp_path) for tau in TEMPERATURES)

    resumed = Recording(pool)
    reports = run(spec, train, tmp_path, resumed)
    assert sum(resumed.delivered.values()) == 2 * len(train) - sum(saved.values())
    assert {tau: r.generated for tau, r in reports.items()} == {
        t: len(train) - saved[t] for t in TEMPERATURES
    }
    assert tables(spec, train, tmp_path) == reference


def test_complete_shards_are_reused_and_seeds_reproduce(spec, train, pool, reference, tmp_path):
    first = run(spec, train, tmp_path, Recording(pool))
    again = Recording(pool)
    second = run(spec, train, tmp_path, again)
    assert not any(r.cached for r in first.values()) and all(r.cached for r in second.values())
    assert sum(again.delivered.values()) == 0
    assert tables(spec, train, tmp_path) == reference  # τ = 0 and τ = 1 identical across runs

    run(spec, train, tmp_path, pool, seed=1)
    reseeded = tables(spec, train, tmp_path, seed=1)
    assert reseeded[0.0].drop_columns(["seed"]) == reference[0.0].drop_columns(["seed"])  # greedy ignores it
    assert reseeded[1.0].column("response_token_ids") != reference[1.0].column("response_token_ids")


def specray(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPECRAY_CACHE=str(cache))
    return subprocess.run(
        [SPECRAY, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_cli_generates_then_reports_a_cache_hit(micro_zoo, tmp_path: Path) -> None:
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / micro_zoo.root.name).symlink_to(micro_zoo.root)  # the CLI finds the zoo built
    first = specray("generate", "sweeps/smoke.yaml", MICRO_ZOO, cache=tmp_path)
    assert first.returncode == 0, first.stderr
    for tau in (0, 1):
        assert f"τ={tau}: generated 64 of 64 responses" in first.stdout
    assert "tokens/s" in first.stdout and "progress teacher: 128/128 responses (100%)" in first.stderr

    second = specray("generate", "sweeps/smoke.yaml", MICRO_ZOO, cache=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("cache hit, 64 responses, nothing generated") == 2
    assert "cache hit for all 2 τ_kd shards: nothing generated" in second.stdout
    assert "Started a local Ray instance" not in second.stderr  # no Ray, no model: nothing to generate

    too_big = specray("generate", "sweeps/smoke.yaml", MICRO_ZOO, "teacher.temperatures=[0.5]",
                      "teacher.replicas=3", "ray.num_cpus=2", cache=tmp_path)  # fmt: skip
    assert too_big.returncode == 2
    assert "error: teacher.replicas x teacher.num_cpus = 3 CPUs, but the local Ray has 2" in too_big.stderr
    assert "Traceback" not in too_big.stderr
