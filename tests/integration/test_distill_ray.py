"""Distillation under real Ray Train (Train V2) with the micro zoo: DDP equivalence, a worker killed mid-run,
several drafts in one run, and the `specray distill` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch

from specray.distill import ray_train
from specray.distill.checkpoints import FINISHED_FILE, is_finished, work_dir
from specray.distill.ray_train import distill, distill_drafts
from specray.draft import one_draft
from specray.faults import FAULTS_DIR_ENV, FAULTS_ENV
from specray.models.loading import load_model
from tests.conftest import REPO
from tests.unit.test_distill_loop import losses, make_shards, micro_spec
from tests.waiting import CLI_TIMEOUT_S

pytestmark = pytest.mark.integration
SPECRAY = str(Path(sys.executable).parent / "specray")
MIXTURE = {0.0: 1.0, 1.0: 1.0}
# Same global batch, same rows, same on-policy samples: only the order of float sums differs between
# one worker and two (the gradient all-reduce), so losses agree to ~1e-7 relative; 1e-5 leaves margin.
DDP_RTOL = 1e-5


@pytest.fixture(scope="module")
def local_ray():
    ray.init("local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        yield
    finally:
        ray.shutdown()


def arm_train_fault(monkeypatch, tmp_path: Path) -> None:
    """Rank 0 SIGKILLs itself right after reporting step 3 (specray/faults.py), once."""
    monkeypatch.setenv(FAULTS_ENV, "train.step=3")
    monkeypatch.setenv(FAULTS_DIR_ENV, str(tmp_path / "faults"))


def ddp_spec(micro_zoo, workers: int, *extra: str):
    overrides = ["distill.steps=6", "distill.report_every=1", "distill.checkpoint_every=2", *extra]
    spec = micro_spec(micro_zoo, *overrides, f"distill.workers={workers}", "distill.onpolicy_fraction=0.5")
    make_shards(spec)
    return spec


@pytest.fixture(scope="module")
def two_workers(micro_zoo, local_ray, tmp_path_factory):
    """The reference: online KD on a τ_kd mixture with 2 DDP workers, uninterrupted, with the LM heads
    chunked 4 response positions at a time (the other runs compared with it take the plain path)."""
    spec = ddp_spec(micro_zoo, 2, "distill.loss_chunk_size=4")
    return distill(one_draft(spec, "online", MIXTURE, tmp_path_factory.mktemp("ddp") / "two"))


def test_two_ddp_workers_train_like_one_on_the_same_global_batch(micro_zoo, two_workers, tmp_path) -> None:
    one = distill(one_draft(ddp_spec(micro_zoo, 1), "online", MIXTURE, tmp_path / "one"))
    assert losses(one.curves) == pytest.approx(losses(two_workers.curves), rel=DDP_RTOL)
    assert len(losses(one.curves)) == 6
    for p, q in zip(
        load_model(str(one.output_dir)).parameters(),
        load_model(str(two_workers.output_dir)).parameters(),
        strict=True,
    ):
        torch.testing.assert_close(p, q, rtol=DDP_RTOL, atol=1e-6)


def test_a_killed_worker_resumes_from_the_last_checkpoint_and_ends_at_the_step_count(
    micro_zoo, two_workers, tmp_path, monkeypatch
) -> None:
    arm_train_fault(monkeypatch, tmp_path)  # rank 0 dies after step 3; the last checkpoint is step 2
    reported: list[dict] = []
    result = distill(
        one_draft(ddp_spec(micro_zoo, 2), "online", MIXTURE, tmp_path / "draft"), reported.append
    )
    assert (tmp_path / "faults" / "train.step").exists()  # the worker really was killed
    finished = json.loads((result.output_dir / FINISHED_FILE).read_text())
    assert finished["resumed_from"] == [2] and finished["steps"] == 6
    assert [c.step for c in result.curves] == list(range(7))
    assert [c.step for c in reported] == list(range(7))  # re-run steps 3.. are not reported twice
    # resumed exactly: the same losses as the uninterrupted run
    assert losses(result.curves) == pytest.approx(losses(two_workers.curves), rel=DDP_RTOL)


def test_a_run_that_dies_leaves_no_finished_draft_and_a_later_call_resumes_it(
    micro_zoo, local_ray, tmp_path, monkeypatch
) -> None:
    # rank 0 dies after step 3; the checkpoint of step 2 was registered by then (a report returns only
    # once the controller has taken the previous one)
    arm_train_fault(monkeypatch, tmp_path)
    monkeypatch.setattr(ray_train, "MAX_FAILURES", 0)
    spec = micro_spec(micro_zoo, "distill.report_every=1")
    make_shards(spec)
    output = tmp_path / "draft"
    with pytest.raises(ray.train.TrainingFailedError):
        distill(one_draft(spec, "offline", {1.0: 1.0}, output))
    assert not is_finished(output) and not output.exists()
    assert list(work_dir(output).rglob("checkpoint_*"))  # kept: a later call resumes from it

    monkeypatch.delenv(FAULTS_ENV)
    result = distill(one_draft(spec, "offline", {1.0: 1.0}, output))  # e.g. after the driver itself died
    assert is_finished(output) and json.loads((output / FINISHED_FILE).read_text())["resumed_from"] == [2]
    assert [c.step for c in result.curves] == [0, 1, 2, 3, 4] and not work_dir(output).exists()


def several_drafts_spec(micro_zoo, checkpoint_every: int):
    spec = micro_spec(
        micro_zoo,
        "distill.steps=2",
        "distill.online_steps=4",
        "distill.report_every=1",
        f"distill.checkpoint_every={checkpoint_every}",
        "distill.onpolicy_fraction=0.5",
    )
    make_shards(spec)
    return spec


@pytest.fixture(scope="module")
def online_alone(micro_zoo, local_ray, tmp_path_factory):
    """The online draft of the several-drafts test, distilled alone and uninterrupted: the reference both
    of its cases end at. One run serves both: their specs differ only in `distill.checkpoint_every`, which
    reaches no key (keys.py: saving a checkpoint changes no weight), so the draft alone is the same."""
    spec = several_drafts_spec(micro_zoo, 2)
    return distill(one_draft(spec, "online", MIXTURE, tmp_path_factory.mktemp("alone") / "alone"))


@pytest.mark.parametrize(
    ("checkpoint_every", "resumed_from"),
    [(2, [2]), (4, [])],  # the online draft's own step-2 checkpoint; or only the offline draft's last one
)
def test_several_drafts_in_one_run_each_resume_only_from_their_own_checkpoint(
    micro_zoo, online_alone, tmp_path, monkeypatch, checkpoint_every, resumed_from
) -> None:
    """One Train run distils an offline draft (2 steps), the same draft again into another folder (same
    key: it resumes from the first one's last checkpoint and publishes it as it is, as after a restart
    between a draft's last checkpoint and its publication), then an online one (4 steps); rank 0 dies
    after the online draft's step 3. The restarted run skips the published drafts and resumes the online
    one from its own latest checkpoint — never from an offline draft's, the run's latest when the online
    draft has none yet — and the online draft ends exactly as when distilled alone."""
    spec = several_drafts_spec(micro_zoo, checkpoint_every)
    alone = online_alone  # distilled before any fault is armed
    arm_train_fault(monkeypatch, tmp_path)
    jobs = [
        one_draft(spec, "offline", {1.0: 1.0}, tmp_path / "offline"),
        one_draft(spec, "offline", {1.0: 1.0}, tmp_path / "offline-again"),
        one_draft(spec, "online", MIXTURE, tmp_path / "online"),
    ]
    reported: dict[str, list[int]] = {}
    published: list[str] = []
    offline, again, online = distill_drafts(
        spec,
        jobs,
        None,
        lambda draft, curve: reported.setdefault(draft, []).append(curve.step),
        published.append,
    )
    assert (tmp_path / "faults" / "train.step").exists()  # the worker really was killed
    names = [job.name for job in jobs]
    assert published == names  # each once, as it was published
    # re-run steps are not passed on twice; the offline draft's twin trains no step
    assert reported == {names[0]: [0, 1, 2], names[2]: [0, 1, 2, 3, 4]}
    finished = [json.loads((r.output_dir / FINISHED_FILE).read_text()) for r in (offline, again, online)]
    assert [f["resumed_from"] for f in finished] == [[], [], resumed_from]
    assert [f["steps"] for f in finished] == [2, 2, 4]
    assert again.curves == offline.curves
    for p, q in zip(
        load_model(str(offline.output_dir)).parameters(),
        load_model(str(again.output_dir)).parameters(),
        strict=True,
    ):
        assert torch.equal(p, q)
    assert losses(online.curves) == pytest.approx(losses(alone.curves), rel=1e-5)
    for p, q in zip(
        load_model(str(alone.output_dir)).parameters(),
        load_model(str(online.output_dir)).parameters(),
        strict=True,
    ):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert not list(tmp_path.glob(".run-*.work"))  # the run's folder goes once every draft is published
    rerun = distill_drafts(spec, jobs, published=published.append)  # all published: nothing runs
    assert [r.curves for r in rerun] == [offline.curves, again.curves, online.curves] and published == names


def specray(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(FAULTS_ENV, None)
    return subprocess.run(
        [SPECRAY, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_cli_distills_and_refuses_bad_requests_before_starting_ray(micro_zoo, tmp_path) -> None:
    make_shards(micro_spec(micro_zoo))
    overrides = [
        f"models.target={{name_or_path: {micro_zoo.target}}}",
        f"models.draft={{name_or_path: {micro_zoo.draft}}}",
        "teacher.max_new_tokens=12",
        "distill.steps=2",
        "distill.batch_size=4",
        "distill.max_new_tokens=8",
        "distill.report_every=1",
        "eval.temperatures=[1.0]",
        "eval.max_new_tokens=8",
        "ray.num_cpus=2",
    ]
    options = ["--paradigm", "online", "--mixture", "0:1,1:3", "--output", str(tmp_path / "draft")]
    ok = specray("distill", "sweeps/smoke.yaml", *overrides, *options)
    assert ok.returncode == 0, ok.stderr
    assert "distilling online/mix=0:1,1:3 for 2 steps" in ok.stdout
    assert "acceptance_rate at τ_dec=1: " in ok.stdout
    # not a terminal: progress lines over the steps, with the latest loss and acceptance
    assert "progress distill: 0/2 steps" in ok.stderr and "online/mix=0:1,1:3 step 2/2: loss " in ok.stderr
    assert is_finished(tmp_path / "draft")

    bad_tau = specray("distill", "sweeps/smoke.yaml", *overrides, "--tau-kd", "0.5")
    assert bad_tau.returncode == 2
    assert "error: τ_kd [0.5] not in teacher.temperatures [0.0, 1.0]" in bad_tau.stderr
    no_shards = specray("distill", "sweeps/smoke.yaml", *overrides, "teacher.seed=5", "--tau-kd", "1.0")
    assert no_shards.returncode == 2 and "run `specray generate` on this sweep first" in no_shards.stderr
    for failed in (bad_tau, no_shards):
        assert "Traceback" not in failed.stderr and "Started a local Ray instance" not in failed.stderr
