"""The TRL side of benchmarks/peers/compare.py: GKDTrainer (online KD) and SFTTrainer (offline SeqKD),
specray's rows.

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
   TRL), bf16 (on by default in `SFTConfig`), and `completion_only_loss`, which defaults to *off* for a
   pre-tokenised dataset (it is inferred from "prompt"/"completion" columns). Set explicitly and checked
   during the run (`model.is_gradient_checkpointing`, the model's dtype, the labels of every batch: exactly
   the response tokens of the planned rows).
5. Order: transformers shuffles the training set unless `train_sampling_strategy="sequential"`; the dataset is
   specray's row plan (`MixtureSampler`), step after step, and every collated batch is checked against it.
6. The schedule: `cosine_with_min_lr` (min_lr_rate 0.1) equals specray's `warmup_cosine` after the warm-up;
   during it transformers ramps step/warmup from 0 where specray ramps (step + 1)/(warmup + 1) — reported.
7. Precision: specray trains fp32 master weights under bf16 autocast where the spec sets
   `distill.cpu_autocast` (the student's forward, its on-policy sampling and the teacher's passes,
   `specray/distill/loop.py`), and loads the teacher in `models.target.dtype`. TRL gets `bf16=True` then:
   `TrainingArguments(bf16=True)` sets `mixed_precision="bf16"`, which accelerate 1.x honours on a CPU
   (`Accelerator.native_amp` is True for bf16 on "cpu"), wrapping the `forward` of the student
   (`prepare_model`) and of GKD's teacher (`prepare_model(..., evaluation_mode=True)`) in
   `torch.autocast("cpu", bfloat16)` and upcasting their outputs to fp32 (`convert_outputs_to_fp32`); the
   generation path keeps the wrapper (`unwrap_model(keep_fp32_wrapper=True)`). Checked at run time, not
   assumed: a forward hook on one matmul (the first `nn.Linear`) of the student and of the teacher records
   whether autocast was on and the dtype of the matmul's output, per phase (training forward, no-grad
   sampling, teacher forward). The teacher is loaded the way specray's `load_model` loads it
   (`from_pretrained(dtype=...)` of `models.target.dtype`), checked from its parameters.
8. Prompts: TRL trains on specray's rows as token ids (the shard's, chat-template prompts included), never
   re-tokenised: the collator's prompts (what GKD samples from) are checked to be the planned rows' prompt
   ids, and GKD's EOS ids (the student's `generation_config`) to be specray's (`sampling.eos_token_ids`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import SFTConfig, SFTTrainer
from trl.experimental.gkd import GKDConfig, GKDTrainer
from trl.experimental.utils import DataCollatorForChatML

from benchmarks.peers.trl_checks import FKL_BETA, Record, TrlMisconfigured, check
from specray.config import SweepSpec
from specray.distill.data import MixtureSampler, TrainRow
from specray.distill.inputs import prepare_inputs
from specray.distill.losses import IGNORE_INDEX
from specray.draft import one_draft
from specray.models.loading import DTYPES
from specray.ops.lr_schedule import MIN_LR_RATIO
from specray.sampling import eos_token_ids


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
        out = inner(examples)
        if "prompts" in out:  # GKD: the prompt ids it samples the student from, padding dropped
            masks = out["prompt_attention_mask"].bool()
            record.prompts.append(
                [tuple(ids[m].tolist()) for ids, m in zip(out["prompts"], masks, strict=True)]
            )
        return out

    return collate


def _record_matmuls(model: torch.nn.Module, role: str, record: Record) -> None:
    """A forward hook on the model's first matmul (`nn.Linear`): whether autocast was on when it ran and the
    dtype of its output, per phase — what mixed precision really did, whatever the config says."""
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))

    def hook(module, inputs, output):
        phase = "forward" if role == "teacher" else "train" if torch.is_grad_enabled() else "sample"
        on = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        record.matmuls.add((role, phase, on, str(output.dtype).removeprefix("torch.")))

    linear.register_forward_hook(hook)


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
        eos = c.eos_token_id
        record.eos.add(tuple(sorted(eos if isinstance(eos, list) else [] if eos is None else [eos])))
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
    """TrainingArguments both trainers get: specray's optimizer, schedule, clipping, seed, save cadence and
    precision (bf16 autocast where the spec trains under it on the CPU, `distill.cpu_autocast`)."""
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
        bf16=d.cpu_autocast,
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
    record = Record()
    trust = spec.models.draft.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(draft, trust_remote_code=trust)
    if tokenizer.pad_token_id is None:  # what specray's load_tokenizer does (and a TRL user must)
        tokenizer.pad_token = tokenizer.eos_token
    # fp32 master weights, as specray's student (`distill/loop_setup.py`); autocast does the bf16
    student = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32, trust_remote_code=trust)
    _record_matmuls(student, "student", record)
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
        "notes": record.notes,
    }


def _gkd(spec, tau_kd, output, rows, tokenizer, student, target, record) -> GKDTrainer:
    d = spec.distill
    if d.divergence != "fkl" or d.loss_temperature != 1.0 or d.grad_accum != 1:
        raise TrlMisconfigured("peers compares FKL at loss temperature 1, one micro-batch per step")
    # the target as specray loads it: `load_model(path, models.target.dtype)`
    ref = spec.models.target
    teacher = AutoModelForCausalLM.from_pretrained(
        target, dtype=DTYPES[ref.dtype], trust_remote_code=ref.trust_remote_code
    )
    record.teacher_dtype = str(next(teacher.parameters()).dtype).removeprefix("torch.")
    _record_matmuls(teacher, "teacher", record)
    ours = sorted(eos_token_ids(student, tokenizer))  # where specray's on-policy samples stop
    configured = student.generation_config.eos_token_id
    if set(configured if isinstance(configured, list) else [configured]) != set(ours):
        # GKD stops at the student's generation_config EOS only; specray also at the tokenizer's
        record.notes.append(f"GKD: the student's generation_config EOS {configured} set to specray's {ours}")
        student.generation_config.eos_token_id = ours
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
