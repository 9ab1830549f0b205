"""The run-time checks of benchmarks/peers/trl_side.py: what the instrumented TRL trainer recorded, step by
step, held against what it was configured to do and against specray's own run of the same rows. Every
problem raises `TrlMisconfigured` (its figures would compare different work); otherwise `check` returns the
lines that say what was checked. What each check reads in TRL's source is listed in trl_side.py's docstring,
by number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from trl.experimental.gkd import GKDTrainer

from specray.config import SweepSpec
from specray.distill.data import TrainRow
from specray.distill.losses import IGNORE_INDEX, distillation_divergence
from specray.ops.lr_schedule import warmup_cosine
from specray.sampling import eos_token_ids
from specray.specdec.hf_compare import expected_processors

FKL_BETA = 0.0  # generalized_jsd_loss(beta=0) is KL(teacher || student): 1. in trl_side.py


class TrlMisconfigured(RuntimeError):
    """TRL did not do what it was configured to do; its figures would compare different work."""


@dataclass
class Record:
    """What the instrumented trainer saw, step by step."""

    step_seconds: list[float] = field(default_factory=list)
    onpolicy: list[bool] = field(default_factory=list)  # per optimizer step: did it sample the student?
    tokens: list[int] = field(default_factory=list)  # non-padding tokens of each step's batch
    loss_tokens: list[int] = field(default_factory=list)  # positions the loss counts
    batches: list[list[tuple[int, ...]]] = field(default_factory=list)  # collated rows, in order
    lrs: list[float] = field(default_factory=list)
    threads: set[int] = field(default_factory=set)
    checkpointing: set[bool] = field(default_factory=set)
    dtypes: set[str] = field(default_factory=set)
    generations: int = 0
    generation_configs: set[tuple] = field(default_factory=set)
    processors: set[tuple] = field(default_factory=set)
    longest_completion: int = 0
    teacher_generations: int = 0
    eos: set[tuple[int, ...]] = field(default_factory=set)  # the EOS ids each on-policy sampling used
    prompts: list[list[tuple[int, ...]]] = field(default_factory=list)  # the collator's prompt ids (GKD)
    # (role, phase, autocast on, matmul output dtype) seen by a forward hook on one matmul of each model
    matmuls: set[tuple[str, str, bool, str]] = field(default_factory=set)
    teacher_dtype: str = ""
    notes: list[str] = field(default_factory=list)  # what could not be matched, said in the output


def _fkl_problem() -> list[str]:
    """GKD's loss at FKL_BETA against specray's fkl on the same random logits."""
    generator = torch.Generator().manual_seed(0)
    student, teacher = (torch.randn(2, 5, 11, generator=generator) * 3 for _ in range(2))
    labels = torch.tensor([[IGNORE_INDEX, 1, 2, 3, IGNORE_INDEX], [IGNORE_INDEX, IGNORE_INDEX, 4, 5, 6]])
    theirs = float(GKDTrainer.generalized_jsd_loss(student, teacher, labels, beta=FKL_BETA))
    ours = float(distillation_divergence(student, teacher, labels, "fkl"))
    if not math.isclose(theirs, ours, rel_tol=1e-5):
        return [f"GKD's loss at beta={FKL_BETA} is {theirs:.6f}, specray's fkl {ours:.6f}: not forward KL"]
    return []


def _schedule_problems(spec: SweepSpec, record: Record) -> tuple[list[str], float]:
    """TRL's rate at every step against specray's: equal after the warm-up; and the warm-up's largest gap."""
    d = spec.distill
    ours = [d.lr * warmup_cosine(k, d.warmup_steps, d.steps) for k in range(len(record.lrs))]
    after = [
        abs(a - b) for a, b, k in zip(record.lrs, ours, range(len(ours)), strict=True) if k >= d.warmup_steps
    ]
    problems = [] if max(after, default=0.0) <= 1e-9 else [f"lr differs after warm-up by {max(after):.3g}"]
    warmup = max((abs(a - b) for a, b in zip(record.lrs[: d.warmup_steps], ours, strict=False)), default=0.0)
    return problems, warmup


def _data_problems(trainer, paradigm: str, steps: list[list[TrainRow]], record: Record) -> list[str]:
    planned = [[r.prompt_ids + r.response_ids for r in batch] for batch in steps]
    problems = []
    if record.batches != planned:
        problems.append("the batches TRL collated are not specray's rows in specray's order")
    if paradigm == "online" and record.prompts != [[r.prompt_ids for r in batch] for batch in steps]:
        problems.append("the prompts GKD's collator made are not the planned rows' prompt token ids")
    expected = [sum(len(r.response_ids) for r in batch) for batch in steps]
    offpolicy = [
        (got, want)
        for got, want, onpolicy in zip(record.loss_tokens, expected, record.onpolicy, strict=False)
        if not onpolicy
    ]
    if any(got != want for got, want in offpolicy):
        problems.append("the loss did not count exactly the teacher responses' tokens on fixed-data steps")
    if paradigm == "offline" and not trainer.completion_only_loss:
        problems.append("SFTTrainer trains on prompt tokens too (completion_only_loss off)")
    return problems


def _expected_matmuls(
    spec: SweepSpec, paradigm: str, record: Record
) -> dict[tuple[str, str], tuple[bool, str]]:
    """(role, phase) -> (autocast on, matmul output dtype) as specray runs it: under bf16 autocast where
    `distill.cpu_autocast` (every pass, the teacher's too), else the weights' own dtype."""
    on = spec.distill.cpu_autocast
    expected = {("student", "train"): (on, "bfloat16" if on else "float32")}
    if paradigm == "online":
        expected["teacher", "forward"] = (on, "bfloat16" if on else record.teacher_dtype)
        if record.generations:
            expected["student", "sample"] = expected["student", "train"]
    return expected


def _precision_problems(trainer, spec: SweepSpec, paradigm: str, record: Record) -> list[str]:
    """The mixed precision TRL was configured with and what its matmuls really ran in; the teacher's dtype."""
    args, on = trainer.args, spec.distill.cpu_autocast
    problems = []
    if args.bf16 != on or args.fp16 or record.dtypes != {"torch.float32"}:
        problems.append(
            f"mixed precision: bf16={args.bf16} (want {on}) fp16={args.fp16}, student weights {record.dtypes}"
        )
    expected = _expected_matmuls(spec, paradigm, record)
    seen: dict[tuple[str, str], set[tuple[bool, str]]] = {}
    for role, phase, autocast_on, dtype in record.matmuls:
        seen.setdefault((role, phase), set()).add((autocast_on, dtype))
    for key, want in expected.items():
        if seen.get(key) != {want}:
            problems.append(
                f"{' '.join(key)} matmuls ran as (autocast, dtype) {seen.get(key)}, specray's {want}"
            )
    for key in set(seen) - set(expected):
        problems.append(f"unexpected {' '.join(key)} matmuls {seen[key]}")
    if paradigm == "online":
        dtype = spec.models.target.dtype
        if dtype != "auto" and record.teacher_dtype != dtype:
            problems.append(f"the teacher's weights are {record.teacher_dtype}, models.target.dtype {dtype}")
    return problems


def _precision_line(name: str, spec: SweepSpec, paradigm: str, record: Record) -> str:
    expected = _expected_matmuls(spec, paradigm, record)
    shown = ", ".join(
        f"{role} {phase} {dtype}{' under autocast' if on else ''}"
        for (role, phase), (on, dtype) in expected.items()
    )
    config = "bf16=True (accelerate's CPU autocast)" if spec.distill.cpu_autocast else "bf16/fp16 off"
    teacher = ""
    if paradigm == "online":
        teacher = f"; teacher loaded {record.teacher_dtype} (models.target.dtype {spec.models.target.dtype})"
    return f"{name}: fp32 master weights, {config}; matmul outputs seen: {shown}{teacher}"


def _unmatched(spec: SweepSpec, paradigm: str, record: Record) -> list[str]:
    """What differs between the tools' work by construction (said in the output, not hidden)."""
    notes = list(record.notes)
    if spec.distill.cpu_autocast:
        notes.append(
            "TRL: accelerate upcasts every autocast forward's outputs (the full logits) to fp32 "
            "(`convert_outputs_to_fp32`); specray keeps the student's logits in bf16 up to the loss, which "
            "is fp32 on both sides"
        )
    elif paradigm == "online" and record.teacher_dtype not in ("float32", "float64"):
        notes.append(
            f"GKD takes log_softmax of the teacher's {record.teacher_dtype} logits in "
            f"{record.teacher_dtype}; specray in fp32"
        )
    return notes


def _gkd_problems(trainer, spec: SweepSpec, tau_kd: float, record: Record) -> list[str]:
    d = spec.distill
    problems = _fkl_problem()
    if (trainer.beta, trainer.lmbda, trainer.temperature, trainer.seq_kd) != (
        FKL_BETA,
        d.onpolicy_fraction,
        tau_kd,
        False,
    ):
        problems.append(
            f"GKD read beta/lmbda/temperature/seq_kd {trainer.beta, trainer.lmbda, trainer.seq_kd}"
        )
    wanted = {(tau_kd, True, 0, 1.0, d.max_new_tokens)}
    if record.generations and record.generation_configs != wanted:
        problems.append(f"on-policy sampling used {record.generation_configs}, expected {wanted}")
    if record.generations and record.processors != {expected_processors(tau_kd)}:
        problems.append(
            f"generate's logits processors {record.processors}, expected {expected_processors(tau_kd)}"
        )
    if record.longest_completion > d.max_new_tokens:
        problems.append(
            f"a completion of {record.longest_completion} tokens > max_new_tokens {d.max_new_tokens}"
        )
    if record.teacher_generations:
        problems.append(f"the teacher generated {record.teacher_generations} times (seq_kd is off)")
    eos = {tuple(sorted(eos_token_ids(trainer.model, trainer.processing_class)))}
    if record.generations and record.eos != eos:
        problems.append(f"on-policy sampling stopped at EOS ids {record.eos}, specray's {eos}")
    n, drawn = len(record.onpolicy), sum(record.onpolicy)
    if abs(drawn - n * d.onpolicy_fraction) > 4 * math.sqrt(
        n * d.onpolicy_fraction * (1 - d.onpolicy_fraction)
    ):
        problems.append(f"{drawn}/{n} on-policy batches: not a coin of p={d.onpolicy_fraction}")
    if drawn != record.generations:
        problems.append(f"{record.generations} student generations in {drawn} on-policy steps")
    return problems


def check(trainer, spec: SweepSpec, paradigm: str, tau_kd: float, steps, record: Record) -> list[str]:
    """Every way this run differs from what it was configured to do -> TrlMisconfigured; else the lines
    that say what was checked."""
    args, d = trainer.args, spec.distill
    problems = _precision_problems(trainer, spec, paradigm, record)
    if args.gradient_checkpointing or record.checkpointing != {False}:
        problems.append(
            f"gradient checkpointing on (config {args.gradient_checkpointing}, {record.checkpointing})"
        )
    if record.threads != {1}:
        problems.append(f"torch threads during training {record.threads}, expected {{1}}")
    if len(record.step_seconds) != d.steps or trainer.state.global_step != d.steps:
        problems.append(
            f"{trainer.state.global_step} optimizer steps ({len(record.step_seconds)} timed), not {d.steps}"
        )
    optimizer = type(getattr(trainer.optimizer, "optimizer", trainer.optimizer)).__name__
    if optimizer != "AdamW":
        problems.append(f"optimizer {optimizer}, not AdamW")
    schedule, warmup_gap = _schedule_problems(spec, record)
    problems += schedule + _data_problems(trainer, paradigm, steps, record)
    if paradigm == "online":
        problems += _gkd_problems(trainer, spec, tau_kd, record)
    name = "GKDTrainer" if paradigm == "online" else "SFTTrainer"
    if problems:
        raise TrlMisconfigured(f"{name} did not run as configured:\n  " + "\n  ".join(problems))
    record.notes = _unmatched(spec, paradigm, record)
    lines = [
        f"{name}: gradient checkpointing off, 1 torch thread, AdamW, batch {d.batch_size}, lr {d.lr:g}, "
        f"{d.steps} steps; lr equal to specray's after the warm-up (warm-up gap ≤ {warmup_gap:.2g})",
        _precision_line(name, spec, paradigm, record),
        f"{name}: every batch is specray's planned rows (token ids, {spec.data.template} template) in order; "
        "fixed-data steps trained on exactly the teacher responses' tokens",
    ]
    if paradigm == "online":
        drawn = sum(record.onpolicy)
        lines.append(
            f"GKDTrainer: loss = specray's fkl (beta={FKL_BETA}); {drawn}/{len(record.onpolicy)} batches "
            f"on-policy (one coin per batch, lmbda={d.onpolicy_fraction:g}); sampling τ={tau_kd:g}, top_k 0, "
            f"top_p 1, processors {sorted(p for p in record.processors if p) or 'none'}; EOS ids "
            f"{sorted(record.eos)[0] if record.eos else '-'}; longest completion "
            f"{record.longest_completion} ≤ {d.max_new_tokens}; teacher generations "
            f"{record.teacher_generations}; prompts = the planned rows' prompt ids"
        )
    else:
        lines.append("SFTTrainer: completion-only loss (labels = the response tokens, prompt masked)")
    return lines
