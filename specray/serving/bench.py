"""`specray bench`: Spec-Bench's protocol on your own models. Every question of a Spec-Bench question file is
answered twice with the same seeds — by speculative decoding (one draft and γ, or an export's routing plan
choosing them by the question's request temperature) and by the target alone — through the target's chat
template, turn by turn, each later turn prompted with the model's own earlier answers. The two answer files
are in Spec-Bench's answer format, so Spec-Bench's own evaluation reads them; `speed_report` computes its
figures the way that evaluation does (`evaluation/speed.py` of the Spec-Bench repository):

- tokens/s of a question = its new tokens over its wall time, summed over turns; a side's tokens/s is the
  mean over questions; speedup = speculative tokens/s over baseline tokens/s;
- mean accepted tokens = the mean of `accept_lengths` over every verification step;
- the speculative side's tokens are the decoder's own counts (`new_tokens`); the baseline's are counted by
  re-tokenising each answer's text and subtracting one for a BOS token. The two counts can differ: the text
  drops EOS and surrounding whitespace, and a tokenizer that adds no BOS loses one real token per turn.
  `decoder_speedup` is the same ratio from the decoder's own counts on both sides.

Unfinished work is kept: each answered question is appended to `<file>.partial` and flushed, and a re-run
with the same settings answers only the questions missing there; the finished `.jsonl` files appear, by
rename, once every question is answered.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specray.config.vocabulary import MT_BENCH_CATEGORIES
from specray.data.chat import encode_chat
from specray.data.spec_bench import Question
from specray.errors import DataError
from specray.metrics import SPEEDUP
from specray.models.loading import decode_text
from specray.seeds import derive_seed
from specray.specdec.decoder import Decoded, autoregressive_decode, speculative_decode

log = logging.getLogger(__name__)

SETTINGS_FILE = "bench.json"


@dataclass(frozen=True)
class Choice:
    """The draft and γ a question is decoded with; no draft means no speculation (the target alone)."""

    draft: str | None
    gamma: int | None


@dataclass(frozen=True)
class BenchSettings:
    """What the answers depend on; a re-run into the same folder must match them."""

    target: str
    temperatures: dict[str, float]  # category -> request temperature
    choices: dict[str, Choice]  # category -> draft and γ
    max_new_tokens: int
    seed: int
    num_choices: int = 1

    def describe_change(self, saved: Mapping[str, Any]) -> list[str]:
        mine = json.loads(json.dumps(asdict(self)))
        return [name for name in mine if saved.get(name) != mine[name]]


@dataclass(frozen=True)
class BenchFiles:
    speculative: Path
    baseline: Path


@dataclass
class Answer:
    """One choice of one question: Spec-Bench's fields, turn by turn."""

    index: int
    turns: list[str] = field(default_factory=list)
    decoding_steps: list[int] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    wall_time: list[float] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)


def model_ids(target: str) -> tuple[str, str]:
    """The model_id of the speculative and of the baseline answer file."""
    name = Path(target.rstrip("/")).name or "target"
    return f"{name}-specray-sd", f"{name}-vanilla"


def _decode(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    prompt: list[int],
    tau: float,
    gamma: int | None,
    max_new_tokens: int,
    eos: int | None,
    seed: int,
) -> Decoded:
    generator = torch.Generator(device=target.device).manual_seed(seed)
    if draft is None or gamma is None:
        return autoregressive_decode(target, prompt, tau, max_new_tokens, eos, generator)
    return speculative_decode(target, draft, prompt, tau, gamma, max_new_tokens, eos, generator)


def answer(
    question: Question,
    tokenizer: PreTrainedTokenizerBase,
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    gamma: int | None,
    tau: float,
    max_new_tokens: int,
    seed: int,
    index: int = 0,
) -> Answer:
    """Answer every turn of `question`, each prompted with the conversation so far (own answers included)."""
    result = Answer(index)
    for turn in range(len(question.turns)):
        prompt = encode_chat(tokenizer, question.turns[: turn + 1], result.turns)
        turn_seed = derive_seed(seed, question.question_id, index, turn)
        out = _decode(target, draft, prompt, tau, gamma, max_new_tokens, tokenizer.eos_token_id, turn_seed)
        result.turns.append(decode_text(tokenizer, out.tokens).strip())
        result.decoding_steps.append(out.stats.target_calls)
        result.new_tokens.append(len(out.tokens))
        result.wall_time.append(out.stats.seconds)
        result.accept_lengths.extend(out.step_tokens)
    return result


def answer_record(question: Question, model_id: str, answers: list[Answer], tau: float) -> dict[str, Any]:
    """One line of a Spec-Bench answer file (plus the request temperature, which Spec-Bench ignores)."""
    return {
        "question_id": question.question_id,
        "category": question.category,
        "answer_id": uuid.uuid4().hex[:22],
        "model_id": model_id,
        "choices": [asdict(a) for a in answers],
        "tstamp": time.time(),
        "temperature": tau,
    }


def run_bench(
    questions: Sequence[Question],
    tokenizer: PreTrainedTokenizerBase,
    target: PreTrainedModel,
    load_draft: Callable[[str], PreTrainedModel],
    settings: BenchSettings,
    out: Path,
    advance: Callable[[int], None] = lambda n: None,
) -> BenchFiles:
    """Answer `questions` both ways into `out`; resumes from the `.partial` files of an earlier run with the
    same settings. `advance(1)` after each question."""
    spec_id, base_id = model_ids(settings.target)
    files = BenchFiles(out / f"{spec_id}.jsonl", out / f"{base_id}.jsonl")
    done = _prepare(out, settings, files)
    drafts: dict[str, PreTrainedModel] = {}
    _warm_up(questions[0], tokenizer, target, load_draft, settings, drafts)
    partial = [Path(f"{path}.partial") for path in (files.speculative, files.baseline)]
    with (
        partial[0].open("a", encoding="utf-8") as spec_file,
        partial[1].open("a", encoding="utf-8") as base_file,
    ):
        for question in questions:
            if question.question_id in done:
                advance(1)
                continue
            tau, choice = settings.temperatures[question.category], settings.choices[question.category]
            draft = _draft(choice, load_draft, drafts)
            spec, base = [], []
            for index in range(settings.num_choices):
                args = (tau, settings.max_new_tokens, settings.seed, index)
                spec.append(answer(question, tokenizer, target, draft, choice.gamma, *args))
                base.append(answer(question, tokenizer, target, None, None, *args))
            # the baseline line first: a question is done once its speculative line is written
            base_file.write(json.dumps(answer_record(question, base_id, base, tau)) + "\n")
            base_file.flush()
            spec_file.write(json.dumps(answer_record(question, spec_id, spec, tau)) + "\n")
            spec_file.flush()
            advance(1)
    for path in (files.speculative, files.baseline):
        _finish(Path(f"{path}.partial"), path, [q.question_id for q in questions])
    return files


def _draft(
    choice: Choice, load_draft: Callable[[str], PreTrainedModel], drafts: dict[str, PreTrainedModel]
) -> PreTrainedModel | None:
    if choice.draft is None:
        return None
    if choice.draft not in drafts:
        drafts[choice.draft] = load_draft(choice.draft)
    return drafts[choice.draft]


def _warm_up(
    question: Question,
    tokenizer: PreTrainedTokenizerBase,
    target: PreTrainedModel,
    load_draft: Callable[[str], PreTrainedModel],
    settings: BenchSettings,
    drafts: dict[str, PreTrainedModel],
) -> None:
    """First calls pay for allocator growth and kernel selection: one short decode with each draft."""
    prompt = encode_chat(tokenizer, question.turns[:1])
    short = min(8, settings.max_new_tokens)
    for choice in {c for c in settings.choices.values()}:
        draft = _draft(choice, load_draft, drafts)
        _decode(target, draft, prompt, 1.0, choice.gamma, short, tokenizer.eos_token_id, settings.seed)
    _decode(target, None, prompt, 1.0, None, short, tokenizer.eos_token_id, settings.seed)


def _prepare(out: Path, settings: BenchSettings, files: BenchFiles) -> set[int]:
    """Make `out`, refuse finished answers or another run's settings there; the question ids both partial
    files already hold."""
    out.mkdir(parents=True, exist_ok=True)
    for path in (files.speculative, files.baseline):
        if path.exists():
            raise DataError(f"{path}: answers already exist; choose another --out or remove them")
    saved_file = out / SETTINGS_FILE
    if saved_file.exists():
        changed = settings.describe_change(json.loads(saved_file.read_text()))
        if changed:
            raise DataError(
                f"{out}: holds unfinished answers of a bench with other settings ({', '.join(changed)} "
                "differ); choose another --out, or remove the folder to start over"
            )
    else:
        saved_file.write_text(json.dumps(asdict(settings), indent=1))
    spec_done, base_done = (_answered(Path(f"{p}.partial")) for p in (files.speculative, files.baseline))
    done = spec_done & base_done
    for path in (files.speculative, files.baseline):  # keep only lines of questions both sides finished
        _keep(Path(f"{path}.partial"), done)
    if done:
        log.info("resuming: %d questions answered by an earlier run are kept", len(done))
    return done


def _answered(path: Path) -> set[int]:
    if not path.exists():
        return set()
    ids = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            ids.add(int(json.loads(line)["question_id"]))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a crash: answered again
    return ids


def _keep(path: Path, done: set[int]) -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if int(json.loads(line)["question_id"]) in done:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            continue
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def _finish(partial: Path, final: Path, order: list[int]) -> None:
    """Write the answers in question order (one line per question) and drop the partial file."""
    lines = {int(json.loads(line)["question_id"]): line for line in partial.read_text().splitlines()}
    tmp = final.with_suffix(".tmp")
    tmp.write_text("".join(lines[qid] + "\n" for qid in order), encoding="utf-8")
    os.replace(tmp, final)
    partial.unlink()


# ---------------------------------------------------------------- Spec-Bench's figures


@dataclass(frozen=True)
class SpeedRow:
    """Spec-Bench's figures for one group of questions."""

    group: str
    questions: int
    temperature: str
    mean_accepted_tokens: float
    tokens_per_s: float
    baseline_tokens_per_s: float
    speedup: float
    decoder_speedup: float


def read_answers(path: Path) -> list[dict[str, Any]]:
    """The lines of an answer file; a bad line is an error naming the file and line."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{number}: not valid JSON ({error.msg})") from None
    return rows


def groups(categories: Iterable[str]) -> list[tuple[str, set[str]]]:
    """Spec-Bench's report groups present here: each category, `mt_bench` when MT-bench categories are among
    others, and `overall`."""
    present = list(dict.fromkeys(categories))
    result = [(c, {c}) for c in present]
    mt = {c for c in present if c in MT_BENCH_CATEGORIES}
    if mt and mt != set(present):
        result.append(("mt_bench", mt))
    if len(present) > 1:
        result.append(("overall", set(present)))
    return result


def speed_report(speculative: Path, baseline: Path, tokenizer: PreTrainedTokenizerBase) -> list[SpeedRow]:
    """Per category, MT-bench and overall: Spec-Bench's mean accepted tokens, tokens/s and speedup."""
    spec_rows, base_rows = read_answers(speculative), read_answers(baseline)
    rows = []
    for name, members in groups(r["category"] for r in spec_rows):
        spec = [r for r in spec_rows if r["category"] in members]
        base = [r for r in base_rows if r["category"] in members]
        speeds = [sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in spec]
        accepted = [n for r in spec for n in r["choices"][0]["accept_lengths"]]
        base_speeds = [_retokenised(r, tokenizer) / sum(r["choices"][0]["wall_time"]) for r in base]
        own = [sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in base]
        taus = sorted({float(r.get("temperature", math.nan)) for r in spec})
        spec_mean, base_mean, own_mean = (float(np.mean(x)) for x in (speeds, base_speeds, own))
        rows.append(
            SpeedRow(
                name,
                len(spec),
                "/".join(f"{t:g}" for t in taus),
                float(np.mean(accepted)),
                spec_mean,
                base_mean,
                _ratio(spec_mean, base_mean),
                _ratio(spec_mean, own_mean),
            )
        )
    return rows


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan  # a baseline of empty answers has no speed to compare with


def _retokenised(row: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase) -> int:
    # Spec-Bench counts the baseline's tokens from its answer text, minus one for a BOS token
    return sum(len(tokenizer(text).input_ids) - 1 for text in row["choices"][0]["turns"])


def identical_at_zero(speculative: Path, baseline: Path) -> tuple[int, int]:
    """(questions decoded at τ = 0 whose speculative answers equal the baseline's, questions at τ = 0)."""
    base = {r["question_id"]: r for r in read_answers(baseline)}
    greedy = [r for r in read_answers(speculative) if r.get("temperature") == 0.0]
    same = sum(
        all(
            a["turns"] == b["turns"]
            for a, b in zip(r["choices"], base[r["question_id"]]["choices"], strict=True)
        )
        for r in greedy
    )
    return same, len(greedy)


def format_report(rows: Sequence[SpeedRow]) -> str:
    """The table `specray bench` prints."""
    header = (
        f"{'group':<16} {'questions':>9} {'τ':>10} {'accepted':>9} {'tokens/s':>9} {'baseline':>9} "
        f"{SPEEDUP:>8} {'(own count)':>11}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.group:<16} {r.questions:>9} {r.temperature:>10} {r.mean_accepted_tokens:>9.2f} "
            f"{r.tokens_per_s:>9.1f} {r.baseline_tokens_per_s:>9.1f} {r.speedup:>8.3f} "
            f"{r.decoder_speedup:>11.3f}"
        )
    return "\n".join(lines)
