"""Shared fixtures: an isolated cache, tiny zoo recipes that build in seconds, the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# Every process the tests start (CLI drivers, benchmarks, Ray's workers) inherits this. The tests keep the
# machine oversubscribed on purpose (several xdist workers, each with its own Ray, on two cores), and there
# an OpenMP thread that finds its team not yet at a barrier spins for it rather than sleeping: torch on two
# threads then burns its time waiting for a core the other processes hold (benchmarks/README.md, "The test
# suite on a fresh clone", has the tiny zoo's build both ways). Set before torch is imported, so that this
# process's own OpenMP reads it too.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the setting above)

if TYPE_CHECKING:  # the GPU suite (tests/gpu/) runs where pydantic is absent: the config loads on use
    from specray.config import ZooSpec

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SPECRAY_SHARED_DATA", REPO.parent / "shared" / "data"))

# Under pytest-xdist (`make test` runs the unit tests on one worker per core) each worker keeps to one
# thread: two workers of two threads each on two cores spend their time waiting for each other.
torch.set_num_threads(1 if "PYTEST_XDIST_WORKER" in os.environ else min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests never touch the user's cache: zoos and shards go to a session temp dir."""
    os.environ["SPECRAY_CACHE"] = str(tmp_path_factory.mktemp("specray-cache"))


def micro_zoo_spec(**overrides) -> ZooSpec:
    """A zoo recipe that trains in a couple of seconds; shapes are tiny but real Llama models."""
    from specray.config import TinyLlamaSpec, ZooSpec

    fields = dict(
        corpus_size=300,
        vocab_size=320,
        seq_len=64,
        batch_size=8,
        target=TinyLlamaSpec(
            hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, train_steps=6, lr=3e-3
        ),
        draft=TinyLlamaSpec(
            hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, train_steps=3, lr=3e-3
        ),
    )
    return ZooSpec(**(fields | overrides))


@pytest.fixture(scope="session")
def micro_zoo(tmp_path_factory: pytest.TempPathFactory):
    from specray.models.zoo import build_zoo

    return build_zoo(micro_zoo_spec(), root=tmp_path_factory.mktemp("zoo"))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA}: these tests need ../shared/data")
    return SHARED_DATA


# ---------------------------------------------------------------- tests that lean on each other
# pytest-xdist hands a module's tests to whichever worker is free, so a test that reads what an earlier test
# left behind (a cached shard, a module-level change) passes or fails with the schedule. Running the suite
# backwards shows such a test at once: `pytest -p no:xdist --reverse-order`.


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reverse-order", action="store_true", help="run the collected tests last to first (see conftest.py)"
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--reverse-order"):
        items.reverse()


# ---------------------------------------------------------------- where the suite's time goes
# CI shows only the tail of its log, and pytest's own `--durations` list comes before the failures and
# warnings: this short per-module table is printed last, so the tail always says which modules to make
# cheaper when the suite nears its time limit.

_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::")[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _MODULE_SECONDS:
        return
    slowest = sorted(_MODULE_SECONDS.items(), key=lambda item: -item[1])[:15]
    total = sum(_MODULE_SECONDS.values())
    terminalreporter.section(f"slowest modules (all tests: {total / 60:.1f} min)")
    for module, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}s  {module}")
