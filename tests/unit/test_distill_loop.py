"""The distillation loop on the micro zoo, in one process: determinism, resume, the published draft.

Also holds the helpers the other distill tests import: a smoke spec over the micro zoo and real teacher
shards for it (sampled in-process by the transformers engine; no Ray).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specray.config import SweepSpec, load_spec
from specray.data.dataset import build_splits
from specray.distill.checkpoints import (
    CURVES_FILE,
    SPEC_FILE,
    TRAINER_STATE,
    is_finished,
    read_finished,
    work_dir,
)
from specray.distill.curves import CurvePoint
from specray.distill.inputs import parse_mixture, prepare_inputs
from specray.distill.loop import train_draft
from specray.draft import draft_name, one_draft
from specray.errors import DataError, SpecError
from specray.models.loading import load_model
from tests.conftest import REPO

TAUS_KD = (0.0, 1.0)


def micro_spec(micro_zoo, *overrides: str) -> SweepSpec:
    """sweeps/smoke.yaml on the micro zoo (by path), with a short distillation."""
    base = [
        f"models.target={{name_or_path: {micro_zoo.target}}}",
        f"models.draft={{name_or_path: {micro_zoo.draft}}}",
        "teacher.max_new_tokens=12",
        "distill.steps=4",
        "distill.batch_size=4",
        "distill.max_new_tokens=8",
        "distill.report_every=2",
        "distill.checkpoint_every=2",
        "distill.warmup_steps=1",
        "eval.temperatures=[0.0,1.0]",
        "eval.max_new_tokens=8",
    ]
    return load_spec(REPO / "sweeps" / "smoke.yaml", [*base, *overrides])


class InProcessPool:
    """The teacher pool's protocol over one in-process transformers engine."""

    def __init__(self, model_path: Path) -> None:
        from specray.teacher.engines import TransformersEngine

        self.engine = TransformersEngine(str(model_path), batch_size=32)

    def generate(self, requests, on_results) -> None:
        on_results(self.engine.generate(list(requests)))


def make_shards(spec: SweepSpec, taus: Sequence[float] = TAUS_KD) -> None:
    """Real teacher shards of the spec's train split (cached by key: a second call is a no-op)."""
    from specray.keys import shard_key
    from specray.teacher.shards import generate_shards

    train = build_splits(spec.data)["train"]
    pool = InProcessPool(Path(spec.models.target.name_or_path))
    t = spec.teacher
    keys = {tau: shard_key(spec, train, tau, t.max_new_tokens, t.seed) for tau in taus}
    generate_shards(spec, train, keys, pool=pool, show_progress=False)


@pytest.fixture(scope="module")
def spec(micro_zoo) -> SweepSpec:
    spec = micro_spec(micro_zoo)
    make_shards(spec)
    return spec


def losses(curves: list[CurvePoint]) -> list[float]:
    return [c.loss for c in curves if c.loss is not None]


# ---------------------------------------------------------------- tests


def test_draft_names() -> None:
    assert draft_name("offline", {0.6: 1.0}) == "offline/tau_kd=0.6"
    assert draft_name("online", {0.9: 1, 0.7: 1, 0.8: 1}) == "online/mix=0.7:1,0.8:1,0.9:1"
    assert draft_name("online", {1.0: 2.5, 0.0: 1}) == "online/mix=0:1,1:2.5"


def test_bad_requests_fail_before_any_work(spec, micro_zoo) -> None:
    # a bad request fails where the draft is planned; a missing shard where its inputs are read
    with pytest.raises(SpecError, match=r"τ_kd \[0.5\] not in teacher.temperatures \[0.0, 1.0\]"):
        one_draft(spec, "offline", {0.5: 1.0}, Path("draft"))
    with pytest.raises(SpecError, match="paradigm 'sideways' is not one of offline, online"):
        one_draft(spec, "sideways", {0.0: 1.0}, Path("draft"))
    too_many_workers = micro_spec(micro_zoo, "distill.workers=8")
    with pytest.raises(SpecError, match=r"distill.batch_size \(4\) must be >= distill.workers \(8\)"):
        one_draft(too_many_workers, "offline", {0.0: 1.0}, Path("draft"))
    no_shards = micro_spec(micro_zoo, "teacher.seed=99")
    with pytest.raises(DataError, match=r"no teacher shards yet for τ_kd \[1.0\]; run `specray generate`"):
        prepare_inputs(one_draft(no_shards, "offline", {1.0: 1.0}, Path("draft")))


def test_a_draft_is_validated_once_where_it_is_planned(spec, tmp_path: Path, monkeypatch) -> None:
    """The request (paradigm, τ_kd, weights, workers) is checked when the `Draft` is made; reading its inputs
    and the loop's setup receive that record and do not check it again (nor does the Train driver)."""
    import specray.draft as draft_module

    checks: list[tuple] = []
    check = draft_module._check_request
    monkeypatch.setattr(draft_module, "_check_request", lambda *args: checks.append(args) or check(*args))
    draft = one_draft(spec, "offline", {1.0: 1.0}, tmp_path / "draft")
    assert len(checks) == 1
    train_draft(draft)  # prepare_inputs, setup_run, the loop, publish
    assert len(checks) == 1 and is_finished(tmp_path / "draft")


@pytest.mark.parametrize("paradigm", ["offline", "online"])
def test_a_run_publishes_a_loadable_draft_with_curves(spec, paradigm, tmp_path: Path) -> None:
    reported: list[CurvePoint] = []
    result = train_draft(one_draft(spec, paradigm, {1.0: 1.0}, tmp_path / "draft"), reported.append)
    assert result.output_dir == tmp_path / "draft" and result.steps == 4
    assert [c.step for c in result.curves] == [0, 2, 4] and reported == result.curves
    first = result.curves[0]
    assert first.loss is None and set(first.acceptance) == set(first.per_prompt) == {0.0, 1.0}
    for curve in result.curves:  # α is the pool of the per-prompt sums the report's bootstrap resamples
        sums = curve.per_prompt[1.0]
        assert curve.acceptance[1.0] == pytest.approx(sum(sums.beta_sums) / sum(sums.tokens), abs=1e-5)
    for curve in result.curves[1:]:
        assert curve.loss and curve.tokens_per_s and curve.loss > 0 and curve.tokens_per_s > 0
        assert 0 <= curve.acceptance[1.0] <= 1
    assert is_finished(result.output_dir) and not work_dir(result.output_dir).exists()
    on_disk = json.loads((result.output_dir / CURVES_FILE).read_text())
    assert on_disk == [c.to_json() for c in result.curves]
    per_prompt = {f"per_prompt_{x}/tau_dec={t}" for x in ("tokens", "beta_sum") for t in (0, 1)}
    assert set(on_disk[0]) == {"step", "acceptance_rate/tau_dec=0", "acceptance_rate/tau_dec=1"} | per_prompt
    assert load_spec(result.output_dir / SPEC_FILE) == spec
    assert not (result.output_dir / TRAINER_STATE).exists()
    trained = load_model(str(result.output_dir)).parameters()
    untrained = load_model(spec.models.draft.name_or_path).parameters()
    assert not all(torch.equal(p, q) for p, q in zip(trained, untrained, strict=True))


def test_online_drafts_train_online_steps_and_offline_drafts_steps(spec, micro_zoo, tmp_path: Path) -> None:
    # `spec` makes the teacher shards both drafts read (the step counts are not in a shard's key): without
    # it this test passed only where another test of the module had run first on the same xdist worker
    both = micro_spec(micro_zoo, "distill.online_steps=6")
    online = train_draft(one_draft(both, "online", {1.0: 1.0}, tmp_path / "online"))
    assert online.steps == 6 and [c.step for c in online.curves] == [0, 2, 4, 6]
    assert load_spec(online.output_dir / SPEC_FILE).distill.steps == 6  # the spec it trained under
    offline = train_draft(one_draft(both, "offline", {1.0: 1.0}, tmp_path / "offline"))
    assert offline.steps == 4 and offline.curves[-1].step == 4


class Crash(Exception):
    pass


def crash_at(step: int):
    def report(curve: CurvePoint) -> None:
        if curve.step == step:
            raise Crash(f"killed at step {step}")

    return report


def test_a_killed_run_leaves_no_draft_and_resumes_from_its_last_checkpoint(spec, micro_zoo, tmp_path) -> None:
    long = micro_spec(micro_zoo, "distill.steps=6", "distill.report_every=1", "distill.checkpoint_every=2")
    reference = train_draft(one_draft(long, "online", {0.0: 1.0, 1.0: 2.0}, tmp_path / "reference"))

    output = tmp_path / "draft"
    with pytest.raises(Crash):  # dies at step 3, after the checkpoint of step 2
        train_draft(one_draft(long, "online", {0.0: 1.0, 1.0: 2.0}, output), crash_at(3))
    assert not output.exists() and not is_finished(output)
    assert [p.name for p in work_dir(output).glob("checkpoint-*")] == ["checkpoint-00000002"]

    reported: list[dict] = []
    resumed = train_draft(one_draft(long, "online", {0.0: 1.0, 1.0: 2.0}, output), reported.append)
    assert [c.step for c in reported] == [3, 4, 5, 6]  # steps up to the checkpoint are not re-reported
    assert [c.step for c in resumed.curves] == list(range(7))
    assert json.loads((output / "finished.json").read_text())["resumed_from"] == [2]
    # the data order is a function of the step: the resumed run is the uninterrupted run
    assert losses(resumed.curves) == pytest.approx(losses(reference.curves), rel=1e-6)


def test_a_changed_spec_never_resumes_a_stale_checkpoint(spec, micro_zoo, tmp_path) -> None:
    output = tmp_path / "draft"
    with pytest.raises(Crash):
        train_draft(one_draft(spec, "offline", {1.0: 1.0}, output), crash_at(4))
    changed = micro_spec(micro_zoo, "distill.lr=0.01")
    result = train_draft(one_draft(changed, "offline", {1.0: 1.0}, output))
    assert json.loads((output / "finished.json").read_text())["resumed_from"] == []
    assert [c.step for c in result.curves] == [0, 2, 4]


@pytest.mark.parametrize("paradigm", ["offline", "online"])
def test_a_same_seed_rerun_reproduces_the_draft_bit_for_bit(spec, tmp_path, paradigm: str) -> None:
    """On one machine with the same versions, the same spec and seed give the same weights, byte for byte
    (their SHA-256 in finished.json), and the same curves. Across machines fp kernels differ, so drafts do
    too (docs/results.md)."""
    first = train_draft(one_draft(spec, paradigm, {1.0: 1.0}, tmp_path / "a"))
    second = train_draft(one_draft(spec, paradigm, {1.0: 1.0}, tmp_path / "b"))
    timeless = [
        [replace(c, tokens_per_s=None, seconds_per_step=None) for c in r.curves] for r in (first, second)
    ]
    assert timeless[0] == timeless[1]
    hashes = [read_finished(r.output_dir).weights_sha256 for r in (first, second)]
    assert hashes[0] and hashes[0] == hashes[1]


def test_the_loop_imports_no_ray_or_mlflow() -> None:
    """STYLE.md rule 1: the loop runs in one process without Ray; only distill.ray_train imports it."""
    script = (
        "import sys, specray.distill, specray.distill.loop\n"
        "print([m for m in ('ray', 'mlflow') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_gradient_accumulation_equals_one_large_batch(micro_zoo, spec, tmp_path) -> None:
    """Offline, B=4 x 1 micro-batch and B=2 x 2 micro-batches train on the same rows (the row plan is
    cut in order) with the loss normalised over the whole step: same losses, same model."""
    large = train_draft(one_draft(spec, "offline", {1.0: 1.0}, tmp_path / "large"))
    accumulated_spec = micro_spec(micro_zoo, "distill.batch_size=2", "distill.grad_accum=2")
    accumulated = train_draft(one_draft(accumulated_spec, "offline", {1.0: 1.0}, tmp_path / "accumulated"))
    assert losses(accumulated.curves) == pytest.approx(losses(large.curves), rel=1e-6)
    for p, q in zip(
        load_model(str(large.output_dir)).parameters(),
        load_model(str(accumulated.output_dir)).parameters(),
        strict=True,
    ):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_mixture_recipes_parse_and_bad_ones_are_refused() -> None:
    assert parse_mixture("0.7:1,0.8:1,0.9:1") == {0.7: 1.0, 0.8: 1.0, 0.9: 1.0}
    assert parse_mixture("0.2, 1.0:3") == {0.2: 1.0, 1.0: 3.0}  # a τ_kd alone weighs 1
    with pytest.raises(SpecError, match="expected TAU:WEIGHT"):
        parse_mixture("0.7:x")
    with pytest.raises(SpecError, match="τ_kd 0.7 appears twice"):
        parse_mixture("0.7:1,0.7:2")
