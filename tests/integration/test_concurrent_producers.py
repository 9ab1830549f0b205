"""One producer per cache entry, across real processes: two processes that need the same teacher shards or
the same target continuations at once produce each entry once and end with the same files.

The overlap is made, not hoped for: the producing process does not finish its work until the other one has
said it is waiting for the entry's lock (`specray.locks` notes "waiting: ..." when it first finds the entry
held; a logging handler turns that note into a file, the barrier). A run in which the second process never
waited fails on the barrier's timeout instead of passing without exercising the lock."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.processes import python_process

pytestmark = pytest.mark.integration


BARRIER = """import logging

class Barrier(logging.Handler):  # the note of a process waiting for a lock becomes a file
    def emit(self, record):
        if record.getMessage().startswith("waiting: "):
            (calls.parent / "waiting").touch()

locks = logging.getLogger("specray.locks")
locks.setLevel(logging.INFO)
locks.addHandler(Barrier())

def until_the_other_waits():
    deadline = time.monotonic() + 240
    while not (calls.parent / "waiting").exists():
        if time.monotonic() > deadline:
            raise SystemExit("the other process never waited for the lock")
        time.sleep(0.05)
"""


def with_barrier(script: str) -> str:
    """A script below with the barrier in place of its `{barrier}` line."""
    return textwrap.dedent(script).replace("{barrier}", BARRIER)


PRODUCE_SHARDS = """
    import sys, time
    from pathlib import Path
    from specray.config import load_spec
    from specray.data.dataset import build_splits
    from specray.keys import shard_key
    from specray.teacher.generation import GenerationResult
    from specray.teacher.shards import generate_shards

    root, calls = Path(sys.argv[1]), Path(sys.argv[2])

    {barrier}

    spec = load_spec(Path("sweeps/smoke.yaml"), ["data.train_size=12", "data.train.size=60"])
    train = build_splits(spec.data)["train"]

    class CountingPool:  # the pool's protocol; every response it makes is one line in `calls`
        def generate(self, requests, on_results):
            with calls.open("a") as f:
                f.writelines(f"{r.prompt_id} {r.tau}\\n" for r in requests)
            until_the_other_waits()  # this process holds the shards' locks: the other must wait
            on_results([GenerationResult(r.prompt_id, r.tau, r.seed, [1, 2], [3, 4, 2], "x y", "stop")
                        for r in requests])

    keys = {tau: shard_key(spec, train, tau, 8, 0) for tau in [0.0, 1.0]}
    reports = generate_shards(spec, train, keys, pool=CountingPool(), root=root, show_progress=False)
    print(sorted(str(r.path) for r in reports.values()))
"""


def test_two_processes_generating_the_same_shards_produce_each_response_once(tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    runs = [
        python_process(with_barrier(PRODUCE_SHARDS), str(tmp_path / "cache"), str(calls)) for _ in range(2)
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outputs]
    assert outputs[0][0] == outputs[1][0]  # both end with the same shards
    requested = calls.read_text().splitlines()
    assert len(requested) == 2 * 12 and len(set(requested)) == 2 * 12  # each response generated once
    shards = [json.loads(path.read_text()) for path in (tmp_path / "cache").glob("**/manifest.json")]
    assert len(shards) == 2


SAMPLE_CONTINUATIONS = """
    import json, sys, time
    from pathlib import Path
    import specray.specdec.evaluator as evaluator
    from specray.specdec.records import EvalSettings

    target, folder, calls = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])

    {barrier}
    real = evaluator.sample_continuations

    def counted(*args, **kwargs):
        with calls.open("a") as f:
            f.write("sampled\\n")
        until_the_other_waits()  # this process holds the continuations' lock: the other must wait
        return real(*args, **kwargs)

    evaluator.sample_continuations = counted
    prompts = {"in_domain": [[5, 6, 7], [8, 9]]}
    settings = EvalSettings(repeats=1, max_new_tokens=6, empirical_prompts=1)
    found = evaluator.Evaluator(target, prompts, settings, continuations_dir=folder)
    print(json.dumps(found.continuations("in_domain", 1.0).responses))
"""


def test_two_processes_sampling_the_same_continuations_sample_them_once(micro_zoo, tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    args = (str(micro_zoo.target), str(tmp_path / "continuations"), str(calls))
    runs = [python_process(with_barrier(SAMPLE_CONTINUATIONS), *args) for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outputs]
    assert outputs[0][0] == outputs[1][0] and json.loads(outputs[0][0])
    assert calls.read_text().splitlines() == ["sampled"]
