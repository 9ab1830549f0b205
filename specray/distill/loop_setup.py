"""What the train loop (`loop.py`) holds, and how it is set up: the student (fresh, or from the session's
latest checkpoint with its optimizer, schedule and RNG state), the teacher where it is needed, the rows'
sampler, the loss, the acceptance probe and, online, the teacher's states of the rows that never change.

A checkpoint of another run (another draft key: spec, paradigm or mixture changed) is refused, never
resumed. Everything that can fail on the request's models (a head that cannot be chunked) fails here,
before the first step.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from specray.config import SweepSpec
from specray.devices import autocast
from specray.distill.checkpoints import RunState, load_trainer_state
from specray.distill.data import MixtureSampler
from specray.distill.inputs import DistillInputs
from specray.distill.losses import ResponseLoss, check_chunkable, unwrap
from specray.distill.probe import AcceptanceProbe
from specray.distill.session import Session
from specray.distill.teacher_states import StaticStates, estimated_mb, kept_prompt_states
from specray.draft import Draft
from specray.models.loading import load_model, load_tokenizer
from specray.ops.lr_schedule import warmup_cosine
from specray.sampling import eos_token_ids

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass
class Run:
    """What the loop holds. `student` may be DDP-wrapped; `unwrap(student)` is the HF model."""

    spec: SweepSpec
    paradigm: str
    session: Session
    student: torch.nn.Module
    teacher: PreTrainedModel | None  # online only (the probe keeps what it needs of the target)
    tokenizer: PreTrainedTokenizerBase
    data: MixtureSampler
    probe: AcceptanceProbe | None  # rank 0 only
    loss: ResponseLoss
    eos_ids: set[int]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    state: RunState  # saved with every checkpoint
    states: StaticStates | None = None  # online: the teacher's side of rows that never change


def _optimizer(student: torch.nn.Module, spec: SweepSpec) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only, never on norms and biases (nanoGPT)."""
    params = [p for p in student.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.distill.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=spec.distill.lr)


def _load_student(
    spec: SweepSpec, inputs: DistillInputs, session: Session, run_fingerprint: str
) -> tuple[PreTrainedModel, dict | None]:
    """The student (from the latest checkpoint, else the spec's draft) and the saved trainer state."""
    trust = spec.models.draft.trust_remote_code
    with session.latest_checkpoint() as folder:
        if folder is None:
            return load_model(inputs.draft_path, "float32", trust), None
        state = load_trainer_state(folder)
        if state["fingerprint"] != run_fingerprint:
            raise RuntimeError(f"{folder}: checkpoint of a different run (spec, paradigm or mixture changed)")
        # fp32 master weights whatever the checkpoint's dtype; autocast does bf16 on GPU
        return load_model(str(folder), "float32", trust), state


def _optimization(
    student: torch.nn.Module, spec: SweepSpec, saved: dict | None, run_fingerprint: str
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR, RunState]:
    """AdamW, its schedule and the run's state: fresh, or as saved in the checkpoint resumed from."""
    d = spec.distill
    optimizer = _optimizer(student, spec)
    schedule = functools.partial(warmup_cosine, warmup_steps=d.warmup_steps, total_steps=d.steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    if saved is None:
        return optimizer, scheduler, RunState(run_fingerprint)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["rng"])
    state = RunState.from_json(saved)
    return optimizer, scheduler, replace(state, resumed_from=[*state.resumed_from, state.step])


def setup_run(draft: Draft, inputs: DistillInputs, session: Session) -> Run:
    spec, paradigm, run_fingerprint = draft.train_spec, draft.paradigm or "", draft.key
    mixture = draft.components  # a mixture's τ_kd, or a control's teacher samples
    d = spec.distill
    torch.manual_seed(d.seed)
    model, saved = _load_student(spec, inputs, session, run_fingerprint)
    tokenizer = load_tokenizer(inputs.draft_path, spec.models.draft.trust_remote_code)
    eos_ids = eos_token_ids(model, tokenizer)
    student = session.prepare(model.train())
    optimization = _optimization(student, spec, saved, run_fingerprint)  # optimizer, scheduler, state
    sources = (d.sources.fixed, d.sources.student) if paradigm == "online" else None
    data = MixtureSampler(inputs.rows, mixture, d.steps, d.batch_size, d.grad_accum, d.seed, sources)
    teacher, probe = teacher_and_probe(spec, paradigm, inputs, session, tokenizer)
    loss = _response_loss(spec, paradigm, model, teacher)  # checks the heads can be chunked first
    run = Run(spec, paradigm, session, student, teacher, tokenizer, data, probe, loss, eos_ids, *optimization)
    with autocast(session.device, d.cpu_autocast):  # the teacher's side as precise as in the loss
        run.states = _static_states(run)
    return run


def _static_states(run: Run) -> StaticStates | None:
    """Online, the teacher's states of every fixed-data and teacher row this rank will train on, computed
    now, and the teacher's caches of every prompt it will see (`teacher_states.py`) — unless
    `distill.teacher_cache_mb` is 0 or too small for the states, or the heads are not chunked (the cached
    states need the logits to be the head applied to them). The prompts get what the states leave."""
    d = run.spec.distill
    if run.teacher is None or d.teacher_cache_mb <= 0 or d.loss_chunk_size <= 0:
        return None
    rows, prompts = run.data.static_rows(run.session.rank, run.session.world_size)
    needed = estimated_mb(rows, unwrap(run.teacher).config.hidden_size)
    if needed > d.teacher_cache_mb:
        log.info("teacher states need %.0f MB > distill.teacher_cache_mb: computed every step", needed)
        return None
    pad, batch_size = run.tokenizer.pad_token_id, run.spec.teacher.batch_size
    cache = kept_prompt_states(run.teacher, prompts, rows, d.teacher_cache_mb - needed, batch_size, pad)
    return StaticStates(run.teacher, rows, run.tokenizer.pad_token_id, run.spec.teacher.batch_size, cache)


def _response_loss(
    spec: SweepSpec, paradigm: str, student: PreTrainedModel, teacher: PreTrainedModel | None
) -> ResponseLoss:
    """The paradigm's loss; a model whose head cannot be chunked fails here, before any step."""
    d = spec.distill
    if d.loss_chunk_size > 0:
        for model in (student, teacher) if teacher is not None else (student,):
            check_chunkable(model)
    divergence = d.draft_divergence if paradigm == "online" else None
    return ResponseLoss(divergence, d.loss_temperature, d.jsd_beta, d.loss_averaging, d.loss_chunk_size)


def teacher_and_probe(
    spec: SweepSpec,
    paradigm: str,
    inputs: DistillInputs,
    session: Session,
    tokenizer: PreTrainedTokenizerBase,
) -> tuple[PreTrainedModel | None, AcceptanceProbe | None]:
    """The target where it is needed: every rank online (teacher logits), rank 0 for the probe."""
    if paradigm == "offline" and session.rank != 0:
        return None, None
    target, e = spec.models.target, spec.eval
    teacher = load_model(inputs.target_path, target.dtype, target.trust_remote_code, session.device)
    teacher.requires_grad_(False)
    settings = (e.temperatures, e.max_new_tokens, tokenizer.eos_token_id, tokenizer.pad_token_id, e.seed)
    probe = AcceptanceProbe(teacher, inputs.probe_prompts, *settings) if session.rank == 0 else None
    return (teacher if paradigm == "online" else None), probe
