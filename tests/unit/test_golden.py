"""Golden values: pinned numbers from the real code paths, so a change of the numerics is seen and decided on.

`test_runs_are_deterministic` (test_distill_loop.py) compares two runs of the same code, so a changed
constant passes it unnoticed. These tests pin what the code computes on a fixed tiny setup, built here
from nothing but seeds (no download, no cache shared with other tests, fp32 on the CPU):

- the losses of every step and the probe's acceptance of a 4-step offline and a 4-step online
  distillation through `train_draft` (the plain loop that `specray distill` and the Ray Train adapter run),
  on the spec's defaults for everything that is numerics (divergence, loss temperature, averaging,
  chunking, data sources, LR schedule);
- each divergence and the cross-entropy of `ResponseLoss` (the loss module the loop runs) at τ = 1 and 2,
  with the spec's default JSD β, on one fixed batch;
- the analytic estimator's acceptance rate and block efficiencies for the zoo's target/draft pair.

Tolerance: rtol 1e-4, atol 1e-6 (`assert_golden`; values under 0.01 get the atol). Another x86 CPU
runs other kernels (AVX-512, AVX2 or none, other MKL code paths): they sum in another order, which moves
fp32 values of these sizes by ~1e-7 to ~1e-6 relative (a few 1e-6 at most, on the smallest losses), and
four AdamW steps carry that forward without amplifying it. To see it, re-pin under
`ATEN_CPU_CAPABILITY=default` (or `avx2`) and `MKL_ENABLE_INSTRUCTIONS=SSE4_2` and compare. A changed
constant moves them by 10 to 1,000 times the tolerance: the loss temperature default 1.0 -> 1.05 moves
the online losses by ~10%, the JSD β default 0.5 -> 0.45 the JSD by ~0.5%; even the LR schedule's
cosine floor 0.1 -> 0.11, which only touches the last steps' learning rate, moves the last step's
acceptance just past the tolerance. Sampled tokens (teacher shards, student samples, the probe's
continuations) are discrete: the same seeds give the same tokens unless a probability lands within
rounding of a sampling boundary, which these few hundred draws do not.

Independence: the tests run on one thread, build their own zoo, shards and spec, and start from a
scrambled global RNG (`_scrambled_rng`), so neither the test order nor the seeds other tests leave
behind can move a value; every random choice of the code under test comes from its own seeds.

Re-pinning after an intended numerics change: run

    SPECRAY_REPIN=1 PYTHONPATH=. .venv/bin/pytest -q -s -p no:cacheprovider tests/unit/test_golden.py

which prints each test's new values as Python literals (the tests then skip); paste them over the
constants below and say in the commit message which change moved them and why that is intended.
"""

from __future__ import annotations

import os
import pprint
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from specray.config import DistillSpec, SweepSpec
from specray.distill.curves import CurvePoint
from specray.distill.loop import train_draft
from specray.distill.losses import IGNORE_INDEX, ResponseLoss
from specray.draft import one_draft
from specray.models.loading import load_model, load_tokenizer
from specray.models.zoo import Zoo, build_zoo
from specray.ops import DIVERGENCES
from specray.specdec.analytic import AnalyticEstimator
from specray.specdec.continuations import sample_continuations
from specray.specdec.records import StepCosts
from tests.conftest import micro_zoo_spec
from tests.unit.test_distill_loop import make_shards

RTOL, ATOL = 1e-4, 1e-6
REPIN = os.environ.get("SPECRAY_REPIN") == "1"

# ---------------------------------------------------------------- the pinned values

OFFLINE = {
    "step=0 acceptance_rate/tau_dec=0": 1.0,
    "step=0 acceptance_rate/tau_dec=0.6": 0.6621689004823565,
    "step=0 acceptance_rate/tau_dec=1": 0.7728105261921883,
    "step=1 acceptance_rate/tau_dec=0": 1.0,
    "step=1 acceptance_rate/tau_dec=0.6": 0.6767472894862294,
    "step=1 acceptance_rate/tau_dec=1": 0.7839390709996223,
    "step=1 loss": 5.51510747273763,
    "step=2 acceptance_rate/tau_dec=0": 0.734375,
    "step=2 acceptance_rate/tau_dec=0.6": 0.6936799697577953,
    "step=2 acceptance_rate/tau_dec=1": 0.7984364796429873,
    "step=2 loss": 5.397705713907878,
    "step=3 acceptance_rate/tau_dec=0": 0.0,
    "step=3 acceptance_rate/tau_dec=0.6": 0.7035906361415982,
    "step=3 acceptance_rate/tau_dec=1": 0.8071707701310515,
    "step=3 loss": 5.279944737752278,
    "step=4 acceptance_rate/tau_dec=0": 0.0,
    "step=4 acceptance_rate/tau_dec=0.6": 0.7069153264164925,
    "step=4 acceptance_rate/tau_dec=1": 0.8103401986882091,
    "step=4 loss": 5.337067794799805,
}
ONLINE = {
    "step=0 acceptance_rate/tau_dec=0": 1.0,
    "step=0 acceptance_rate/tau_dec=0.6": 0.6621689004823565,
    "step=0 acceptance_rate/tau_dec=1": 0.7728105261921883,
    "step=1 acceptance_rate/tau_dec=0": 1.0,
    "step=1 acceptance_rate/tau_dec=0.6": 0.6908506648615003,
    "step=1 acceptance_rate/tau_dec=1": 0.7949054595082998,
    "step=1 loss": 0.14181995391845703,
    "step=2 acceptance_rate/tau_dec=0": 0.0,
    "step=2 acceptance_rate/tau_dec=0.6": 0.7255788911134005,
    "step=2 acceptance_rate/tau_dec=1": 0.8244525641202927,
    "step=2 loss": 0.11683707237243653,
    "step=3 acceptance_rate/tau_dec=0": 0.0,
    "step=3 acceptance_rate/tau_dec=0.6": 0.7416955633088946,
    "step=3 acceptance_rate/tau_dec=1": 0.839891042560339,
    "step=3 loss": 0.0940029501914978,
    "step=4 acceptance_rate/tau_dec=0": 0.0,
    "step=4 acceptance_rate/tau_dec=0.6": 0.7472309665754437,
    "step=4 acceptance_rate/tau_dec=1": 0.8451949935406446,
    "step=4 loss": 0.07757956981658935,
}
LOSSES = {
    "cross_entropy tau=1": 5.888147354125977,
    "fkl tau=1": 0.09192229062318802,
    "rkl tau=1": 0.08220693469047546,
    "jsd tau=1": 0.02123849466443062,
    "tvd tau=1": 0.16256169974803925,
    "fkl tau=2": 0.018172837793827057,
    "rkl tau=2": 0.016923030838370323,
    "jsd tau=2": 0.004358371719717979,
    "tvd tau=2": 0.07029390335083008,
}
ANALYTIC_FIELDS = (
    "acceptance_rate",
    "block_efficiency",
    "block_efficiency_simulated",
    "block_efficiency_sampled",
    "drafted_per_step",
    "speedup_model",
)
ANALYTIC = {
    "tau_dec=0 acceptance_rate": 0.9,
    "tau_dec=0 block_efficiency": 3.4390000000000005,
    "tau_dec=0 block_efficiency_simulated": 2.5,
    "tau_dec=0 block_efficiency_sampled": 2.5,
    "tau_dec=0 drafted_per_step": 2.5,
    "tau_dec=0 speedup_model": 2.0,
    "tau_dec=0.6 acceptance_rate": 0.6913229681943592,
    "tau_dec=0.6 block_efficiency": 2.4996526353417656,
    "tau_dec=0.6 block_efficiency_simulated": 2.2336147580209595,
    "tau_dec=0.6 block_efficiency_sampled": 2.3087328330400383,
    "tau_dec=0.6 drafted_per_step": 2.7765801960875667,
    "tau_dec=0.6 speedup_model": 1.8070037503048089,
    "tau_dec=1 acceptance_rate": 0.8063563924086722,
    "tau_dec=1 block_efficiency": 2.980868523172266,
    "tau_dec=1 block_efficiency_simulated": 2.6217428294891936,
    "tau_dec=1 block_efficiency_sampled": 2.505590823948474,
    "tau_dec=1 drafted_per_step": 2.766964292331882,
    "tau_dec=1 speedup_model": 1.9625580259932165,
}

# ---------------------------------------------------------------- the fixed setup


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """One thread: the same summation order on any machine's core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _scrambled_rng() -> Iterator[None]:
    """Each test starts from an unpredictable global RNG (restored afterwards): a value that read it
    instead of its own seed would not reproduce."""
    python_state = random.getstate()
    with torch.random.fork_rng():
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
        random.seed(os.urandom(8))
        yield
    random.setstate(python_state)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory, _one_thread) -> Zoo:
    spec = micro_zoo_spec()
    # pre-trained long enough that the pair agrees on some greedy tokens: τ_dec = 0 is then not all zeros
    shapes = {
        name: getattr(spec, name).model_copy(update={"train_steps": 40}) for name in ("target", "draft")
    }
    return build_zoo(spec.model_copy(update=shapes), root=tmp_path_factory.mktemp("golden-zoo"))


def golden_spec(zoo: Zoo) -> SweepSpec:
    """Sizes and seeds set here, not read from sweeps/: editing a sweep file cannot move a golden value.
    Everything that is numerics keeps the spec's defaults, so changing a default is seen."""
    source = {"kind": "synthetic", "size": 120, "seed": 7}
    return SweepSpec.model_validate(
        {
            "name": "golden",
            "models": {
                "target": {"name_or_path": str(zoo.target)},
                "draft": {"name_or_path": str(zoo.draft)},
            },
            "data": {
                "train": source,
                "out_of_domain": source | {"families": ["word_problem"], "seed": 8},
                "train_size": 16,
                "validation_size": 8,
                "in_domain_test_size": 4,
                "out_of_domain_test_size": 4,
            },
            "teacher": {"max_new_tokens": 12, "temperatures": [1.0], "seed": 3},
            "distill": {
                "steps": 4,
                "batch_size": 4,
                "max_new_tokens": 8,
                "warmup_steps": 1,
                "report_every": 1,
                "checkpoint_every": 4,
                "lr": 3e-3,
            },
            "eval": {"temperatures": [0.0, 0.6, 1.0], "max_new_tokens": 8, "seed": 5},
        }
    )


@pytest.fixture(scope="module")
def spec(zoo: Zoo) -> SweepSpec:
    spec = golden_spec(zoo)
    make_shards(spec, [1.0])
    return spec


def assert_golden(name: str, actual: dict, pinned: dict) -> None:
    """`actual` equals `pinned` key by key within the module's tolerance, or, when re-pinning, is printed."""
    if REPIN:
        print(f"\n{name} = {pprint.pformat(actual, width=110, sort_dicts=False)}")
        pytest.skip(f"SPECRAY_REPIN=1: {name} printed, not checked")
    assert list(actual) == list(pinned), f"{name}: other keys than pinned"
    moved = [
        f"  {key}: {actual[key]!r}, pinned {expected!r}"
        for key, expected in pinned.items()
        if actual[key] != pytest.approx(expected, rel=RTOL, abs=ATOL)
    ]
    assert not moved, f"{name} moved (re-pin only if intended: see this module's docstring):\n" + "\n".join(
        moved
    )


def _curve_values(curves: list[CurvePoint]) -> dict:
    """Per reported step: its loss (none at step 0) and the probe's acceptance at each τ_dec, under the
    curve's JSON names (those of curves.json and MLflow)."""
    out = {}
    for curve in curves:
        flat = curve.to_json()
        for key in sorted(flat):
            if key == "loss" or key.startswith("acceptance_rate/"):
                out[f"step={curve.step} {key}"] = flat[key]
    return out


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("paradigm", ["offline", "online"])
def test_a_four_step_distillation_reproduces_its_pinned_curve(spec, paradigm, tmp_path: Path) -> None:
    result = train_draft(one_draft(spec, paradigm, {1.0: 1.0}, tmp_path / paradigm))
    assert [c.step for c in result.curves] == [0, 1, 2, 3, 4]
    assert_golden(
        paradigm.upper(), _curve_values(result.curves), OFFLINE if paradigm == "offline" else ONLINE
    )


def _fixed_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two right-padded rows, prompt positions ignored: input_ids, attention_mask, labels [2, 10]."""
    generator = torch.Generator().manual_seed(11)
    input_ids = torch.randint(3, vocab, (2, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[0, 3:9] = input_ids[0, 4:10]
    labels[1, 5:7] = input_ids[1, 6:8]
    return input_ids, attention_mask, labels


@torch.no_grad()
def test_each_loss_of_the_loop_reproduces_its_pinned_value(zoo) -> None:
    defaults = DistillSpec()
    student, teacher = load_model(str(zoo.draft)), load_model(str(zoo.target))
    batch = _fixed_batch(student.config.vocab_size)
    values = {}
    for temperature in (1.0, 2.0):
        for divergence in (None, *DIVERGENCES) if temperature == 1.0 else DIVERGENCES:
            loss = ResponseLoss(
                divergence, temperature, defaults.jsd_beta, defaults.loss_averaging, defaults.loss_chunk_size
            )
            units = loss.units(batch[2])
            values[f"{divergence or 'cross_entropy'} tau={temperature:g}"] = float(
                loss(student, teacher, *batch) / units
            )
    assert_golden("LOSSES", values, LOSSES)


@torch.no_grad()
def test_the_analytic_acceptance_of_the_zoo_pair_reproduces_its_pinned_value(zoo) -> None:
    tokenizer = load_tokenizer(str(zoo.target))
    texts = ["Sort 3, 1, 2.", "List two fruits.", "Copy: the cat sat.", "Count the words in: a b c."]
    prompts = tokenizer(texts)["input_ids"]
    target, draft = load_model(str(zoo.target)), load_model(str(zoo.draft))
    values = {}
    for tau in (0.0, 0.6, 1.0):
        continuations = sample_continuations(
            target, prompts, tau, 10, tokenizer.eos_token_id, seed=13, pad_token_id=tokenizer.pad_token_id
        )
        estimator = AnalyticEstimator(target, continuations, tokenizer.pad_token_id)
        result = estimator.evaluate(draft, gamma=3, costs=StepCosts.fixed(0.1, gammas=[3]))
        for name in ANALYTIC_FIELDS:
            values[f"tau_dec={tau:g} {name}"] = getattr(result, name)
    assert_golden("ANALYTIC", values, ANALYTIC)
