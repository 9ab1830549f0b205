"""The Ray eval pool (real Ray, local), the `specray evaluate` CLI, and analytic-vs-empirical agreement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from specray.config import load_spec
from specray.models.loading import load_tokenizer
from specray.models.zoo import build_zoo
from specray.specdec.cells import encode_test_prompts
from specray.specdec.evaluator import EvalJob, EvalSettings, Evaluator
from specray.specdec.workers import EvalPool
from tests.conftest import REPO, micro_zoo_spec
from tests.waiting import CLI_TIMEOUT_S

pytestmark = pytest.mark.integration
SETTINGS = EvalSettings(gamma=3, repeats=1, max_new_tokens=10, empirical_prompts=2, cost_ratio=0.2)


@pytest.fixture(scope="module")
def local_ray():
    ray.init("local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def test_killed_actor_cell_is_retried_and_every_cell_appears_once(local_ray, micro_zoo) -> None:
    tokenizer = load_tokenizer(str(micro_zoo.target))
    prompts = {"in_domain": tokenizer(["Copy this.", "List fruits.", "Sort 2, 1."])["input_ids"]}
    drafts = {"draft": str(micro_zoo.draft), "self": str(micro_zoo.target)}
    jobs = [EvalJob(n, p, tau, "in_domain", "analytic") for n, p in drafts.items() for tau in (0.0, 0.5, 1.0)]
    pool = EvalPool(str(micro_zoo.target), prompts, SETTINGS, replicas=2, num_cpus=1)
    killed = []

    def kill_once(record: dict) -> None:
        if not killed:  # the other actor is busy with a cell right now: kill it mid-cell
            victim = next(a for a in pool.actors)
            ray.kill(victim, no_restart=True)
            killed.append(victim)

    with pool:
        records = pool.run(jobs, on_result=kill_once)
    assert killed
    assert [r["draft"] for r in records] == [j.draft for j in jobs]
    assert len({(r["draft"], r["tau_dec"]) for r in records}) == len(jobs)
    # the pool gives what the in-process evaluator gives (analytic cells are deterministic)
    local = Evaluator(str(micro_zoo.target), prompts, SETTINGS)
    for job, record in zip(jobs, records, strict=True):
        assert record["acceptance_rate"] == pytest.approx(local.evaluate(job)["acceptance_rate"], abs=1e-6)
    assert all(r["acceptance_rate"] == pytest.approx(1.0, abs=1e-5) for r in records if r["draft"] == "self")


@pytest.fixture(scope="module")
def tiny_zoo():
    """The embedded default's zoo (~3.5 min to build on 2 cores), kept in a repo-local cache between runs."""
    return build_zoo(
        load_spec(REPO / "sweeps" / "tiny.yaml").models.zoo, root=REPO / ".specray-cache" / "zoo"
    )


@pytest.mark.parametrize("tau", [0.0, 0.6, 1.0])
def test_analytic_acceptance_lies_in_the_empirical_interval(tiny_zoo, tau: float) -> None:
    """Both estimators on the same 32 in-domain prompts of the tiny zoo: analytic inside the empirical 95%
    interval (empirical: 32 prompts × R = 3 real speculative decodes, γ = 4)."""
    spec = load_spec(REPO / "sweeps" / "tiny.yaml")
    prompts = {"in_domain": encode_test_prompts(spec, load_tokenizer(str(tiny_zoo.target)))["in_domain"][:32]}
    settings = EvalSettings(
        gamma=4, repeats=3, max_new_tokens=48, empirical_prompts=32, cost_ratio=0.3, seed=1
    )
    evaluator = Evaluator(str(tiny_zoo.target), prompts, settings)
    analytic = evaluator.evaluate(EvalJob("draft", str(tiny_zoo.draft), tau, "in_domain", "analytic"))
    empirical = evaluator.evaluate(EvalJob("draft", str(tiny_zoo.draft), tau, "in_domain", "empirical"))
    half_width = empirical["acceptance_rate_ci95"]
    assert abs(analytic["acceptance_rate"] - empirical["acceptance_rate"]) <= half_width, (
        analytic,
        empirical,
    )


def test_evaluate_cli_prints_the_table_and_refuses_a_foreign_draft(tmp_path: Path, micro_zoo) -> None:
    specray = str(Path(sys.executable).parent / "specray")
    out = tmp_path / "records.json"
    args = ["evaluate", "sweeps/smoke.yaml", "eval.estimators=[analytic]", "--output", str(out)]
    run = subprocess.run([specray, *args], cwd=REPO, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "non-distill on in_domain" in run.stdout and "acceptance_rate" in run.stdout
    records = json.loads(out.read_text())
    assert len(records) == 2 * 2  # 2 τ_dec × 2 test sets
    foreign = build_zoo(micro_zoo_spec(vocab_size=300, corpus_size=100), root=tmp_path / "zoo")
    args = ["evaluate", "sweeps/smoke.yaml", "--draft", str(foreign.draft)]
    run = subprocess.run([specray, *args], cwd=REPO, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert run.returncode == 2
    assert "different vocabularies" in run.stderr and "Traceback" not in run.stderr
