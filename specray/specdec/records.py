"""What the evaluation stage is asked to do and what it returns, as frozen records.

An `EvalJob` is one cell of the grid — (draft, test set, τ_dec, estimator, γ, lenience function, ε) —
carrying its content key (`specray.keys.cell_key_inputs`). The `ends` estimator is not speculative: it
decodes the target alone and the draft alone on the empirical cells' prompts and seeds, for the two ends
of the quality–speedup trade-off (γ = 0, ε = 1). A `CellRecord` is the cell's result: it is saved to disk
as JSON under its key before its metrics go to MLflow, and read back unchanged (`from_json`); its metrics,
typed, are its estimator's result (`results.py`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from specray.keys.format import FORMAT, FORMAT_VERSION, check_format
from specray.specdec.results import AnalyticResult, EmpiricalResult, typed_result

Estimator = Literal["analytic", "empirical", "ends"]


@dataclass(frozen=True)
class EvalJob:
    """One cell. `draft` is a display name (e.g. offline/tau_kd=0.6), `draft_path` an HF dir, `key` the
    content key of the cell ("" where nothing is cached, e.g. `specray evaluate`)."""

    draft: str
    draft_path: str
    tau_dec: float
    test_set: str
    estimator: Estimator
    gamma: int
    draft_key: str = ""
    key: str = ""
    key_inputs: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    lenience: str | None = None  # the lenience function; None when lossless (ε = 1)
    epsilon: float = 1.0
    batch_size: int = 1  # rows decoded together (empirical cells; analytic ones model every B at once)

    @property
    def label(self) -> str:
        """Readable coordinates, for logs and errors."""
        label = f"{self.draft}|{self.test_set}|tau_dec={self.tau_dec:g}|{self.estimator}|gamma={self.gamma}"
        label = label if self.batch_size == 1 else f"{label}|B={self.batch_size}"
        return label if self.epsilon == 1.0 else f"{label}|{self.lenience} eps={self.epsilon:g}"


@dataclass(frozen=True)
class EvalSettings:
    repeats: int
    max_new_tokens: int
    empirical_prompts: int
    seed: int = 0
    step_costs: StepCosts | None = None  # what every analytic cell's speedup is modelled from
    batch_size: int = 16  # sequences per teacher-forced pass of the analytic estimator
    timing_precision: float = 0.02  # the step costs' 95% intervals, relative (`specdec.cost`)


@dataclass(frozen=True)
class Timing:
    """Mean seconds of one kind of decoding step, with the half-width of its 95% interval."""

    seconds: float
    ci95: float

    @property
    def relative(self) -> float:
        return self.ci95 / self.seconds if self.seconds > 0 else math.inf


@dataclass(frozen=True)
class CostTerms:
    """What a decode at one (γ, B) costs, in seconds: a target-only step T_t(B, 1), each drafted token
    (its draft step T_d(B) and its share of the verification pass, which is linear in its length between
    the timed k = 1 and k = γ + 1), and each model's prefill P_t(B), P_d(B):

        speedup = (tokens·T_t(B,1) + decodes·P_t) / (steps·T_t(B,1) + drafted·t_token + decodes·(P_t + P_d))
        t_token = T_d(B) + (T_t(B, γ+1) − T_t(B, 1)) / γ

    for decodes that emitted `tokens` in `steps` verification steps with `drafted` draft tokens (sums or
    means per decode; numpy arrays too). `decodes` 0 is the steady state of a server's decode phase, per
    step. With T_t(B, γ+1) = T_t(B, 1), drafted = γ·steps and no prefill it is the papers' τ_b / (c·γ + 1).
    """

    target_step: float
    per_drafted_token: float
    prefill_target: float = 0.0
    prefill_draft: float = 0.0

    def speedup(self, tokens: Any, steps: Any, drafted: Any, decodes: Any = 0) -> Any:
        spent = steps * self.target_step + drafted * self.per_drafted_token
        prefill = decodes * self.prefill_target
        return (tokens * self.target_step + prefill) / (spent + prefill + decodes * self.prefill_draft)


@dataclass(frozen=True)
class StepCosts:
    """What decoding costs, per batch size B: the target's pass over k new tokens per row, T_t(B, k)
    (k = 1: a target-only step; k = γ + 1: a verification pass), the draft's one-token step T_d(B), and each
    model's prefill of B prompts, P_t(B) and P_d(B).

    Each time is spent as the decoders spend it (a step's forward pass with its sampling or verification;
    a prefill with the decode's setup), on prompts of `context_length` tokens on average, over `steps`
    steps per timed decode. `source` "fixed" is the spec's `eval.draft_cost_ratio`: T_t = 1 for every k,
    T_d = c and no prefill (verification costs one target step: the papers' model).
    """

    target: dict[int, dict[int, Timing]]  # B -> k -> T_t(B, k)
    draft: dict[int, Timing]  # B -> T_d(B)
    source: Literal["measured", "fixed"]
    prefill_target: dict[int, Timing] = field(default_factory=dict)  # B -> P_t(B); none: 0
    prefill_draft: dict[int, Timing] = field(default_factory=dict)  # B -> P_d(B); none: 0
    context_length: int = 0
    steps: int = 0  # steps per timed decode
    rounds: int = 0  # timed decodes per (B, γ), interleaved
    device: str = "cpu"
    key: str = ""
    key_inputs: dict[str, Any] = field(default_factory=dict, compare=False)  # what `key` is a digest of

    @classmethod
    def fixed(cls, c: float, batch_sizes: Sequence[int] = (1,), gammas: Sequence[int] = (4,)) -> StepCosts:
        """The papers' model at a given c: T_t(B, k) = 1 for every k, T_d(B) = c, no prefill."""
        one, ks = Timing(1.0, 0.0), [1, *(g + 1 for g in gammas)]
        return cls(
            {b: dict.fromkeys(ks, one) for b in batch_sizes},
            dict.fromkeys(batch_sizes, Timing(c, 0.0)),
            "fixed",
        )

    @property
    def batch_sizes(self) -> list[int]:
        return sorted(self.draft)

    @property
    def gammas(self) -> list[int]:
        return sorted(k - 1 for k in self.target[self.batch_sizes[0]] if k > 1)

    def cost_ratio(self, batch_size: int = 1) -> float:
        """c = T_d(B) / T_t(B, 1)."""
        return self.draft[batch_size].seconds / self.target[batch_size][1].seconds

    def verify_cost(self, gamma: int, batch_size: int = 1) -> float:
        """T_t(B, γ + 1) / T_t(B, 1): a verification pass in target steps."""
        by_k = self.target[batch_size]
        return by_k[gamma + 1].seconds / by_k[1].seconds

    def covers(self, gammas: Sequence[int], batch_sizes: Sequence[int]) -> bool:
        """Whether every (γ, B) a grid needs was timed."""
        return all(b in self.draft and all(g + 1 in self.target[b] for g in gammas) for b in batch_sizes)

    def terms(self, gamma: int, batch_size: int = 1) -> CostTerms:
        """The costs a decode at (γ, B) is made of (`CostTerms`)."""
        return _terms({name: t.seconds for name, t in self._timings(batch_size, gamma).items()}, gamma)

    def speedup(
        self,
        tokens_per_step: float,
        gamma: int,
        batch_size: int = 1,
        drafted_per_step: float | None = None,
        tokens_per_decode: float | None = None,
    ) -> float:
        """The modelled speedup at (γ, B) from the expected tokens E and drafted tokens d (γ when not
        given) per verification step: of whole decodes (prefills in) given the mean new tokens per decode
        L, else of the decode phase, per step (`CostTerms`)."""
        terms = self.terms(gamma, batch_size)
        return _speedup(terms, tokens_per_step, gamma, drafted_per_step, tokens_per_decode)

    def speedup_ci95(
        self,
        tokens_per_step: float,
        tokens_per_step_ci95: float,
        gamma: int,
        batch_size: int = 1,
        drafted_per_step: float | None = None,
        tokens_per_decode: float | None = None,
    ) -> float:
        """Half-width of `speedup`'s 95% interval: E's and every timing's, independent, combined to first
        order (each moved by its half-width, the changes added in quadrature)."""
        timings = self._timings(batch_size, gamma)
        base = {name: t.seconds for name, t in timings.items()}
        rest = (gamma, drafted_per_step, tokens_per_decode)
        value = _speedup(_terms(base, gamma), tokens_per_step, *rest)
        moved = [_speedup(_terms(base, gamma), tokens_per_step + tokens_per_step_ci95, *rest) - value]
        for name, timing in timings.items():
            shifted = base | {name: timing.seconds + timing.ci95}
            moved.append(_speedup(_terms(shifted, gamma), tokens_per_step, *rest) - value)
        return math.sqrt(sum(m * m for m in moved)) if all(map(math.isfinite, moved)) else math.nan

    def _timings(self, b: int, gamma: int) -> dict[str, Timing]:
        """The timings one (γ, B) reads; a fixed c's verification pass is one target step at any γ."""
        if b not in self.draft or (gamma + 1 not in self.target[b] and self.source != "fixed"):
            raise ValueError(
                f"the step costs were timed at γ {self.gammas} and B {self.batch_sizes}, not at γ {gamma}, "
                f"B {b}: time them again with this grid (a changed eval.gamma or eval.batch_sizes does)"
            )
        zero, by_k = Timing(0.0, 0.0), self.target[b]
        return {
            f"target_{gamma + 1}": by_k.get(gamma + 1, by_k[1]),
            "draft": self.draft[b],
            "prefill_target": self.prefill_target.get(b, zero),
            "prefill_draft": self.prefill_draft.get(b, zero),
        } | {f"target_{k}": t for k, t in self.target[b].items()}

    def to_json(self) -> dict[str, Any]:
        payload = asdict(self)
        payload["target"] = {
            str(b): {str(k): asdict(t) for k, t in ks.items()} for b, ks in self.target.items()
        }
        for name in _BY_BATCH:
            payload[name] = {str(b): asdict(t) for b, t in getattr(self, name).items()}
        return payload

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> StepCosts:
        """Read `to_json`'s object (a sweep's step_costs/<key>.json, an MLflow run's records)."""
        rest = {k: v for k, v in payload.items() if k != "target" and k not in _BY_BATCH}
        target = {int(b): {int(k): Timing(**t) for k, t in ks.items()} for b, ks in payload["target"].items()}
        by_batch = {name: {int(b): Timing(**t) for b, t in payload[name].items()} for name in _BY_BATCH}
        return cls(
            target,
            by_batch["draft"],
            prefill_target=by_batch["prefill_target"],
            prefill_draft=by_batch["prefill_draft"],
            **rest,
        )

    def fingerprint(self) -> str:
        """A digest of the measured values (what analytic cells are keyed by), not of where they are kept."""
        payload = {k: v for k, v in self.to_json().items() if k not in ("key", "key_inputs")}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]

    def describe(self) -> str:
        """How the costs were obtained, in one line: the CLI's, the sweep log's and the report header's."""
        c = self.cost_ratio(self.batch_sizes[0])
        if self.source == "fixed":
            return f"c = {c:.4g} (fixed by eval.draft_cost_ratio; verification costs one target step)"
        b, gamma = self.batch_sizes[0], self.gammas[-1]
        t1 = self.target[b][1]
        return (
            f"T_t({b},1) = {1e3 * t1.seconds:.3g} ms ± {100 * t1.relative:.1f}%, c = T_d/T_t = {c:.3f}, "
            f"a γ = {gamma} verification pass = {self.verify_cost(gamma, b):.2f} target steps (95%; "
            f"{self.rounds} interleaved rounds of {self.steps} steps on {self.device}, prompts of "
            f"{self.context_length} tokens, B = {', '.join(map(str, self.batch_sizes))})"
        )


_BY_BATCH = ("draft", "prefill_target", "prefill_draft")


def _terms(seconds: Mapping[str, float], gamma: int) -> CostTerms:
    step = seconds["target_1"]
    per_token = seconds["draft"] + (seconds[f"target_{gamma + 1}"] - step) / gamma
    return CostTerms(step, per_token, seconds["prefill_target"], seconds["prefill_draft"])


def _speedup(
    terms: CostTerms, tokens_per_step: float, gamma: int, drafted: float | None, length: float | None
) -> float:
    drafted_per_step = float(gamma) if drafted is None else drafted
    if length is None:
        return float(terms.speedup(tokens_per_step, 1.0, drafted_per_step))
    steps = length / tokens_per_step
    return float(terms.speedup(length, steps, steps * drafted_per_step, 1.0))


@dataclass(frozen=True)
class CellRecord:
    """The result of one cell: its coordinates, key, the c it used, and the estimator's metrics."""

    draft: str
    draft_key: str
    test_set: str
    tau_dec: float
    estimator: Estimator
    gamma: int
    key: str
    c: float | None
    seconds: float
    metrics: dict[str, Any]
    key_inputs: dict[str, Any] = field(default_factory=dict)
    lenience: str | None = None  # the lenience function; None when lossless (ε = 1)
    epsilon: float = 1.0
    batch_size: int = 1

    @classmethod
    def of(cls, job: EvalJob, c: float | None, seconds: float, metrics: Mapping[str, Any]) -> CellRecord:
        return cls(
            job.draft,
            job.draft_key,
            job.test_set,
            job.tau_dec,
            job.estimator,
            job.gamma,
            job.key,
            c,
            seconds,
            dict(metrics),
            dict(job.key_inputs),
            job.lenience,
            job.epsilon,
            job.batch_size,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {FORMAT: FORMAT_VERSION}

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> CellRecord:
        """`to_json`'s object; `keys.OlderFormat` for a record of another format (it is recomputed)."""
        return cls(**check_format(payload, cls))

    @classmethod
    def from_flat(cls, row: Mapping[str, Any]) -> CellRecord:
        """A `flat()` row read back (a tune's `cells.json`): every coordinate, the rest its metrics (the key's
        inputs are not in a row)."""
        coordinates = [f.name for f in fields(cls) if f.name not in ("metrics", "key_inputs")]
        metrics = {k: v for k, v in row.items() if k not in coordinates}
        return cls(**{name: row[name] for name in coordinates}, metrics=metrics)

    def analytic(self) -> AnalyticResult:
        """The metrics of an analytic cell, typed (`typed_result`)."""
        if self.estimator != "analytic":
            raise ValueError(f"{self.key} is an {self.estimator} cell, not an analytic one")
        return typed_result(AnalyticResult, self.metrics)

    def empirical(self) -> EmpiricalResult:
        """The metrics of an empirical cell, typed (`typed_result`; its decoded outputs are not kept)."""
        if self.estimator != "empirical":
            raise ValueError(f"{self.key} is an {self.estimator} cell, not an empirical one")
        return typed_result(EmpiricalResult, self.metrics)

    def flat(self) -> dict[str, Any]:
        """Coordinates and metrics in one flat dict (a report row; lists such as β per position kept).
        The metrics as a saved record reads back (`files.write_json` sorts keys, dicts' too): a row is the
        same whether this run evaluated its cell or a resumed run read it back (the report's cells.csv
        follows the rows' order of keys and prints dict figures such as the cost terms)."""
        coordinates = {k: v for k, v in asdict(self).items() if k not in ("metrics", "key_inputs")}
        return coordinates | json.loads(json.dumps(self.metrics, sort_keys=True))
