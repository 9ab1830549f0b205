"""The TRL side of benchmarks/peers.py: GKDTrainer (online KD) and SFTTrainer (offline SeqKD), specray's rows.

TRL runs as its users run it — models loaded with `from_pretrained`, a `datasets.Dataset`, TRL's own
collators, its config objects and `trainer.train()` — and every setting the comparison depends on is read
where TRL reads it and checked at run time, the discipline of `specray/specdec/hf_compare.py`. Read in trl
1.16.0 (`trl/experimental/gkd/gkd_trainer.py`, `trl/trainer/sft_trainer.py`) and transformers 5.24
(`trainer.py`):

1. `GKDTrainer.generalized_jsd_loss`: beta 0 is
   `F.kl_div(student_log_probs, teacher_log_probs, log_target=True)`
   = Σ p_teacher (log p_teacher − log q_student), forward KL — specray's `fkl`; beta 1 is reverse KL. Its
   `compute_loss` never passes `temperature`, so the loss runs at temperature 1 whatever the config says;
   `GKDConfig.temperature` is the on-policy *sampling* temperature only. Checked: the loss TRL trains with,
   on random logits, equals specray's FKL.
2. On-policy: `training_step` flips one coin per batch (`random.random() <= lmbda`) and then replaces *every*
   row's response with a student sample; specray mixes per row (round(λ·B) rows of every batch). Counted by
   wrapping `generate_on_policy_outputs`: the fraction of batches it actually drew is reported, raw and
   λ-weighted (its on-policy and its fixed-data steps timed apart).
3. Sampling: `GenerationConfig(temperature, do_sample, top_k=0, top_p=1.0, max_new_tokens)`; checked from the
   config each call saw and from the logits processors `generate` built (only the warper at τ, none at τ=1),
   and no completion longer than `max_new_tokens`. `seq_kd` off: the teacher never generates (counted).
4. `SFTConfig` defaults that would silently change the work: `gradient_checkpointing` (on by default in recent
   TRL), bf16, and `completion_only_loss`, which defaults to *off* for a pre-tokenised dataset (it is inferred
   from "prompt"/"completion" columns). Set explicitly and checked during the run
   (`model.is_gradient_checkpointing`, the model's dtype, the labels of every batch: exactly the response
   tokens of the planned rows).
5. Order: transformers shuffles the training set unless `train_sampling_strategy="sequential"`; the dataset is
   specray's row plan (`MixtureSampler`), step after step, and every collated batch is checked against it.
6. The schedule: `cosine_with_min_lr` (min_lr_rate 0.1) equals specray's `warmup_cosine` after the warm-up;
   during it transformers ramps step/warmup from 0 where specray ramps (step + 1)/(warmup + 1) — reported.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import SFTConfig, SFTTrainer
from trl.experimental.gkd import GKDConfig, GKDTrainer
from trl.experimental.utils import DataCollatorForChatML

from specray.config import SweepSpec
from specray.distill.data import MixtureSampler, TrainRow
from specray.distill.inputs import prepare_inputs
from specray.distill.losses import IGNORE_INDEX, distillation_divergence
from specray.draft import one_draft
from specray.ops.lr_schedule import MIN_LR_RATIO, warmup_cosine
from specray.specdec.hf_compare import expected_processors

FKL_BETA = 0.0  # generalized_jsd_loss(beta=0) is KL(teacher || student): see 1. above


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


class _Steps(TrainerCallback):
    """Times each optimizer step (begin to end: no data loading, logging or saving) and samples the state
    the checks need."""

    def __init__(self, record: Record) -> None:
        self.record, self.started, self.generations = record, 0.0, 0

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.record.lrs.append(optimizer.param_groups[0]["lr"])  # the rate this step uses
        self.generations = self.record.generations
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.record.step_seconds.append(time.perf_counter() - self.started)
        self.record.onpolicy.append(self.record.generations > self.generations)
        self.record.threads.add(torch.get_num_threads())
        self.record.checkpointing.add(bool(getattr(model, "is_gradient_checkpointing", False)))
        self.record.dtypes.add(str(next(model.parameters()).dtype))


def _collator(inner, record: Record):
    def collate(examples: list[dict[str, Any]]) -> dict[str, Any]:
        record.batches.append([tuple(e["input_ids"]) for e in examples])
        return inner(examples)

    return collate


def _record_loss_inputs(trainer, record: Record) -> None:
    """Count, in every loss call, the batch's non-padding tokens and the positions its labels count (labels
    are shifted by one inside both losses: the first column never counts)."""
    compute_loss = trainer.compute_loss

    def recorded(model, inputs, *args, **kwargs):
        record.tokens.append(int(inputs["attention_mask"].sum()))
        record.loss_tokens.append(int((inputs["labels"][:, 1:] != IGNORE_INDEX).sum()))
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = recorded


def _record_generation(trainer, record: Record) -> None:
    """Count GKD's on-policy batches and record what their sampling used (instance attributes shadow the
    class's methods; `self.generate_on_policy_outputs(...)` finds them)."""
    generate = trainer.generate_on_policy_outputs

    def recorded(model, inputs, generation_config):
        record.generations += 1
        c = generation_config
        record.generation_configs.add((c.temperature, c.do_sample, c.top_k, c.top_p, c.max_new_tokens))
        ids, mask, labels = generate(model, inputs, generation_config)
        width = inputs["prompts"].shape[1]
        record.longest_completion = max(record.longest_completion, int(mask[:, width:].sum(dim=1).max()))
        return ids, mask, labels

    trainer.generate_on_policy_outputs = recorded
    get_processors = trainer.model._get_logits_processor

    def processors(*args, **kwargs):
        built = get_processors(*args, **kwargs)
        record.processors.add(tuple((type(p).__name__, getattr(p, "temperature", None)) for p in built))
        return built

    trainer.model._get_logits_processor = processors
    teacher_generate = trainer.teacher_model.generate

    def teacher(*args, **kwargs):
        record.teacher_generations += 1
        return teacher_generate(*args, **kwargs)

    trainer.teacher_model.generate = teacher


def planned_rows(spec: SweepSpec, paradigm: str, tau_kd: float) -> list[list[TrainRow]]:
    """specray's rows for every step (reading the τ_kd shard: a TRL user reads the teacher data too)."""
    d = spec.distill
    inputs = prepare_inputs(one_draft(spec, paradigm, {tau_kd: 1.0}, Path("draft")))
    sampler = MixtureSampler(inputs.rows, {tau_kd: 1.0}, d.steps, d.batch_size, 1, d.seed)
    return [sampler.micro_batch(step, 0) for step in range(1, d.steps + 1)]


def _common(spec: SweepSpec, output: Path) -> dict[str, Any]:
    """TrainingArguments both trainers get: specray's optimizer, schedule, clipping, seed and save cadence."""
    d = spec.distill
    return dict(
        output_dir=str(output),
        max_steps=d.steps,
        per_device_train_batch_size=d.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=d.lr,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": MIN_LR_RATIO},
        warmup_steps=d.warmup_steps,
        weight_decay=d.weight_decay,
        max_grad_norm=d.max_grad_norm,
        optim="adamw_torch",
        seed=d.seed,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        train_sampling_strategy="sequential",
        dataloader_num_workers=0,
        logging_steps=d.report_every,
        save_strategy="steps",
        save_steps=d.checkpoint_every,
        save_total_limit=1,
        report_to="none",
        disable_tqdm=True,
    )


def run_trl(spec: SweepSpec, paradigm: str, tau_kd: float, output: Path, draft: str, target: str) -> dict:
    """Train with GKDTrainer (online) or SFTTrainer (offline), end to end: read the rows, load the models,
    build the dataset and trainer, train, save. Returns the timings, the counts and the checks' lines;
    raises TrlMisconfigured if any check fails."""
    started = time.perf_counter()
    spec = spec.for_paradigm(paradigm)
    steps = planned_rows(spec, paradigm, tau_kd)
    rows = [row for batch in steps for row in batch]
    tokenizer = AutoTokenizer.from_pretrained(draft)
    student = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32)
    record = Record()
    if paradigm == "online":
        trainer = _gkd(spec, tau_kd, output, rows, tokenizer, student, target, record)
    else:
        trainer = _sft(spec, output, rows, tokenizer, student, record)
    trainer.add_callback(_Steps(record))
    _record_loss_inputs(trainer, record)
    setup = time.perf_counter() - started
    trainer.train()
    trainer.save_model(str(output / "final"))
    seconds = time.perf_counter() - started
    lines = check(trainer, spec, paradigm, tau_kd, steps, record)
    return {
        "seconds": seconds,
        "setup_seconds": setup,
        "step_seconds": record.step_seconds,
        "onpolicy": record.onpolicy,
        "tokens": record.tokens,
        "loss_tokens": record.loss_tokens,
        "draft": str(output / "final"),
        "checks": lines,
    }


def _gkd(spec, tau_kd, output, rows, tokenizer, student, target, record) -> GKDTrainer:
    d = spec.distill
    if d.divergence != "fkl" or d.loss_temperature != 1.0 or d.grad_accum != 1:
        raise TrlMisconfigured("peers compares FKL at loss temperature 1, one micro-batch per step")
    teacher = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    config = GKDConfig(
        **_common(spec, output),
        lmbda=d.onpolicy_fraction,
        beta=FKL_BETA,
        temperature=tau_kd,
        max_new_tokens=d.max_new_tokens,
        seq_kd=False,
    )
    dataset = Dataset.from_dict(
        {
            "prompt": [tokenizer.decode(r.prompt_ids) for r in rows],  # the collator asks; not re-tokenised
            "input_ids": [list(r.prompt_ids + r.response_ids) for r in rows],
            "completion_mask": [[0] * len(r.prompt_ids) + [1] * len(r.response_ids) for r in rows],
        }
    )
    collator = DataCollatorForChatML(tokenizer=tokenizer, max_length=config.max_length)
    trainer = GKDTrainer(
        model=student,
        teacher_model=teacher,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        data_collator=_collator(collator, record),
    )
    _record_generation(trainer, record)
    return trainer


def _sft(spec, output, rows, tokenizer, student, record) -> SFTTrainer:
    config = SFTConfig(**_common(spec, output), completion_only_loss=True, packing=False, padding_free=False)
    dataset = Dataset.from_dict(
        {
            "input_ids": [list(r.prompt_ids + r.response_ids) for r in rows],
            "completion_mask": [[0] * len(r.prompt_ids) + [1] * len(r.response_ids) for r in rows],
        }
    )
    trainer = SFTTrainer(model=student, args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.data_collator = _collator(trainer.data_collator, record)
    return trainer


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
    problems = []
    if args.bf16 or args.fp16 or record.dtypes != {"torch.float32"}:
        problems.append(f"mixed precision: bf16={args.bf16} fp16={args.fp16}, weights {record.dtypes}")
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
    lines = [
        f"{name}: fp32 weights, bf16/fp16 off, gradient checkpointing off, 1 torch thread, AdamW, "
        f"{d.steps} steps; lr equal to specray's after the warm-up (warm-up gap ≤ {warmup_gap:.2g})",
        f"{name}: every batch is specray's planned rows in order; fixed-data steps trained on exactly the "
        "teacher responses' tokens",
    ]
    if paradigm == "online":
        drawn = sum(record.onpolicy)
        lines.append(
            f"GKDTrainer: loss = specray's fkl (beta={FKL_BETA}); {drawn}/{len(record.onpolicy)} batches "
            f"on-policy (one coin per batch, lmbda={d.onpolicy_fraction:g}); sampling τ={tau_kd:g}, top_k 0, "
            f"top_p 1, processors {sorted(p for p in record.processors if p) or 'none'}; longest completion "
            f"{record.longest_completion} ≤ {d.max_new_tokens}; "
            f"teacher generations {record.teacher_generations}"
        )
    else:
        lines.append("SFTTrainer: completion-only loss (labels = the response tokens, prompt masked)")
    return lines
