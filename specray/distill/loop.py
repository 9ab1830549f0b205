"""The distillation train loop: a plain function that runs in one process, without Ray.

One run distils the draft (student) towards the target (teacher) for `distill.steps` optimizer steps:

- *offline* (SeqKD, black-box): cross-entropy on teacher responses read from the τ_kd shards, prompt masked.
- *online* (white-box): every micro-batch draws its rows from the sources of `distill.data_sources`
  (DistillSpec Table 1; presets in specray/config/presets.py): a fraction λ2 of the rows get a fresh response
  sampled from the current student (KV cache, no grad, eval mode) at the row's own τ_kd — so in a mixture
  each τ_kd keeps its weight in the on-policy share too —, a fraction λ1 the dataset's ground-truth
  response to the same prompt, and the rest keep the teacher's response from the τ_kd shard. The default
  preset (tempspec_teacher) is λ2 = λ = `distill.onpolicy_fraction`, λ1 = 0. The loss is the chosen
  divergence between teacher and student distributions on the response tokens (teacher under no_grad).

Data rows follow `data.MixtureSampler`: every random choice is a function of (seed, step, row), so a resumed
run and an N-worker run see exactly the rows of an uninterrupted single-worker run. The loss of a step is a
mean over all its response tokens (every micro-batch, every rank), or with `distill.loss_averaging: sequence`
a mean over all its responses of each one's token mean: each rank backpropagates
`its sum × world_size / global count` (tokens or responses: `ResponseLoss.units`), which DDP's gradient
averaging turns into the gradient of the global mean. At a large vocabulary the loss is chunked over the
LM heads (`distill.loss_chunk_size`, see `losses.py`). AdamW (built with the rest of what the loop holds,
fresh or resumed, in `loop_setup.py`), linear warm-up then cosine decay to 10% (nanoGPT), gradient
clipping, gradient accumulation, bf16 autocast on CUDA (and on the CPU with `distill.cpu_autocast`: the
teacher's passes too, so both sides of the loss are computed alike).

Every `report_every` steps (and at step 0 and the last step) a curve point is reported: loss, tokens/s,
learning rate and, where the convergence test needs it (`convergence.probe_due`: every report of the last
quarter, a few before), the analytic acceptance at each eval τ_dec on a few validation prompts (`probe.py`).
Every `checkpoint_every` steps (and at the last step) rank 0 writes a checkpoint (`checkpoints.py`).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specray.config import SweepSpec
from specray.devices import Resources, autocast
from specray.distill.checkpoints import (
    FinishedDraft,
    RunState,
    claim_work_dir,
    load_trainer_state,
    publish,
    save_checkpoint,
)
from specray.distill.convergence import probe_due
from specray.distill.curves import CurvePoint
from specray.distill.data import TrainRow, collate
from specray.distill.inputs import DistillInputs, prepare_inputs
from specray.distill.loop_setup import Run, setup_run
from specray.distill.losses import unwrap
from specray.distill.session import LocalSession, Session
from specray.draft import Draft
from specray.keys import curve_inputs
from specray.sampling import sample_batch
from specray.seeds import derive_seed

__all__ = ["DistillResult", "finished_info", "run_training", "train_draft", "worker_resources"]


@dataclass
class DistillResult:
    """`curves` has one point per report; the first (step 0, the un-distilled draft) has only the probe's
    acceptance."""

    output_dir: Path  # the published HF model dir (safetensors + tokenizer + spec.yaml + curves.json)
    steps: int
    curves: list[CurvePoint]


@dataclass
class _Window:
    """Training progress since the last report (loss is weighted by its units, time excludes probes)."""

    loss_sum: float = 0.0
    loss_units: float = 0.0
    tokens: float = 0.0
    seconds: float = 0.0
    steps: list[int] = field(default_factory=list)


# ---------------------------------------------------------------- one optimizer step


def _with_student_samples(
    run: Run, rows: list[TrainRow], chosen: list[int], step: int, micro: int
) -> list[TrainRow]:
    """`rows` with the responses of the `chosen` (global) indices replaced by student samples at each
    row's τ_kd. Row i's sampler is seeded by (seed, step, micro, i): the same on any rank count."""
    if not chosen:
        return rows
    d, device = run.spec.distill, run.session.device
    student = unwrap(run.student)
    student.eval()  # no dropout while sampling; the wrapper is bypassed: no DDP hooks, no grads
    generators = [
        torch.Generator(device=device).manual_seed(derive_seed(d.seed, "student", step, micro, i))
        for i in chosen
    ]
    with autocast(device, run.spec.distill.cpu_autocast):
        samples = sample_batch(
            student,
            [rows[i].prompt_ids for i in chosen],
            [rows[i].tau_kd for i in chosen],
            generators,
            d.max_new_tokens,
            run.eos_ids,
            run.tokenizer.pad_token_id,
        )
    student.train()
    replaced = list(rows)
    for i, sample in zip(chosen, samples, strict=True):
        replaced[i] = TrainRow(rows[i].prompt_ids, tuple(sample.token_ids), rows[i].tau_kd)
    return replaced


def _local_rows(run: Run, step: int, micro: int) -> list[TrainRow]:
    """This rank's slice of global micro-batch `micro` of `step`; online, the on-policy rows replace their
    responses with student samples."""
    rows, local, chosen = run.data.planned(step, micro, run.session.rank, run.session.world_size)
    rows = _with_student_samples(run, rows, chosen, step, micro)
    return [rows[i] for i in local]


def _train_step(run: Run, step: int, window: _Window) -> None:
    """One optimizer step over `grad_accum` micro-batches; adds its loss and tokens to `window`."""
    d, session, pad = run.spec.distill, run.session, run.tokenizer.pad_token_id
    micro_rows = [_local_rows(run, step, micro) for micro in range(d.grad_accum)]
    batches = [collate(rows, pad).to(session.device) for rows in micro_rows]
    static, teacher = run.states, run.teacher
    with autocast(session.device, d.cpu_autocast):
        states = [
            None if static is None or teacher is None else static.for_batch(teacher, rows, pad)
            for rows in micro_rows
        ]
    local_counts = [sum(run.loss.units(b.labels) for b in batches), sum(b.tokens for b in batches)]
    loss_units, tokens = session.all_reduce(torch.tensor(local_counts, dtype=torch.float64)).tolist()
    scale = session.world_size / max(loss_units, 1.0)  # DDP averages gradients over ranks
    loss_sum = 0.0
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        no_sync = getattr(run.student, "no_sync", None)  # DDP: all-reduce gradients once, at the end
        with nullcontext() if last or no_sync is None else no_sync():
            with autocast(session.device, d.cpu_autocast):
                inputs = (batch.input_ids, batch.attention_mask, batch.labels, states[i])
                loss = run.loss(run.student, run.teacher, *inputs)
            (loss * scale).backward()
        loss_sum += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(run.student.parameters(), d.max_grad_norm)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    window.loss_sum += float(session.all_reduce(torch.tensor([loss_sum], dtype=torch.float64)))
    window.loss_units += loss_units
    window.tokens += tokens


# ---------------------------------------------------------------- reports and checkpoints


def _curve(run: Run, step: int, window: _Window) -> CurvePoint:
    """One curve point: the window's loss and throughput, and (rank 0, where due) the probe's acceptance."""
    d = run.spec.distill
    due = run.probe is not None and probe_due(step, d.steps, d.report_every)
    acceptance, per_prompt = run.probe(unwrap(run.student)) if due and run.probe else ({}, {})
    if not window.steps:
        return CurvePoint(step, acceptance=acceptance, per_prompt=per_prompt)
    return CurvePoint(
        step,
        loss=window.loss_sum / max(window.loss_units, 1.0),
        tokens_per_s=window.tokens / max(window.seconds, 1e-9),
        seconds_per_step=window.seconds / len(window.steps),
        lr=float(run.scheduler.get_last_lr()[0]),
        acceptance=acceptance,
        per_prompt=per_prompt,
    )


def _checkpoint(run: Run) -> Path:
    """Rank 0 writes a checkpoint into a fresh scratch folder and hands it to the session."""
    folder = Path(tempfile.mkdtemp(prefix=".checkpoint-", dir=run.session.scratch_dir))
    state = run.state.to_json() | {
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "rng": torch.get_rng_state(),
    }
    save_checkpoint(folder, unwrap(run.student), run.tokenizer, state)
    return folder


def _after_step(run: Run, step: int, window: _Window) -> bool:
    """Report and/or checkpoint when due; True if a curve point was reported (the window restarts)."""
    d = run.spec.distill
    last = step == d.steps
    report = step == 0 or step % d.report_every == 0 or last
    save = step > 0 and (step % d.checkpoint_every == 0 or last)
    if not (report or save):
        return False
    run.state.step = step
    curve = _curve(run, step, window) if report else None
    if curve is not None:
        run.state.curves.append(curve)
    folder = _checkpoint(run) if save and run.session.rank == 0 else None
    run.session.report(step, curve, folder, save)
    return report


def run_training(draft: Draft, inputs: DistillInputs, session: Session) -> list[CurvePoint]:
    """Train `draft` from the session's latest checkpoint (or the student) to its `distill.steps`; returns
    the curves. The last step always ends with a checkpoint: that checkpoint is what gets published.
    """
    run = setup_run(draft, inputs, session)
    spec = run.spec
    if run.state.step == 0:
        _after_step(run, 0, _Window())  # the un-distilled draft: the curve starts at step 0
    window = _Window()
    for step in range(run.state.step + 1, spec.distill.steps + 1):
        started = time.perf_counter()
        _train_step(run, step, window)
        window.seconds += time.perf_counter() - started
        window.steps.append(step)
        if _after_step(run, step, window):
            window = _Window()
    return run.state.curves


def worker_resources(spec: SweepSpec) -> Resources:
    """What one distill worker (or Tune trial) reserves: the loop's device follows from it."""
    return Resources(spec.distill.num_cpus_per_worker, spec.distill.num_gpus_per_worker)


def train_draft(
    draft: Draft,
    report: Callable[[CurvePoint], None] | None = None,
    *,
    inputs: DistillInputs | None = None,
) -> DistillResult:
    """Distil `draft` in this process and publish it in its folder (see checkpoints.py).

    `report` receives each curve point as it is produced. A run killed midway resumes from its latest
    checkpoint (kept in `.<folder name>.work` beside it) when called again with the same draft; curve points
    after that checkpoint are then reported again (same values: the run is deterministic).
    """
    output_dir = Path(draft.folder).absolute()
    spec = draft.train_spec
    inputs = inputs or prepare_inputs(draft)
    started = time.perf_counter()
    work = claim_work_dir(output_dir, draft.key)
    session = LocalSession(work, report, worker_resources(spec).torch_device())
    curves = run_training(draft, inputs, session)
    final = session.checkpoints()[-1]
    state = RunState.from_json(load_trainer_state(final))
    publish(final, output_dir, spec, finished_info(draft, state, time.perf_counter() - started))
    shutil.rmtree(work, ignore_errors=True)
    return DistillResult(output_dir, spec.distill.steps, curves)


def finished_info(draft: Draft, state: RunState, seconds: float) -> FinishedDraft:
    """What the completion marker records about the run (`state`: its last checkpoint's)."""
    spec = draft.train_spec
    if state.step != spec.distill.steps:
        raise RuntimeError(f"the last checkpoint is at step {state.step}, not {spec.distill.steps}")
    return FinishedDraft(
        draft=draft.name,
        paradigm=draft.paradigm or "",
        mixture={f"{tau:g}": weight for tau, weight in sorted(draft.mixture.items())},
        steps=state.step,
        resumed_from=state.resumed_from,
        fingerprint=state.fingerprint,
        key_inputs=dict(draft.key_inputs),
        curve_inputs=curve_inputs(spec),
        seconds=round(seconds, 1),
    )
