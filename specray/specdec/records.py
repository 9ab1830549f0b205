"""What the evaluation stage is asked to do and what it returns, as frozen records.

An `EvalJob` is one cell of the grid — (draft, test set, τ_dec, estimator, γ, lenience function, ε) —
carrying its content key (`specray.keys.cell_key_inputs`). The `ends` estimator is not speculative: it
decodes the target alone and the draft alone on the empirical cells' prompts and seeds, for the two ends
of the quality–speedup trade-off (γ = 0, ε = 1). A `CellRecord` is the cell's result: it is saved to disk
as JSON under its key before its metrics go to MLflow, and read back unchanged (`from_json`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

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

    @property
    def label(self) -> str:
        """Readable coordinates, for logs and errors."""
        label = f"{self.draft}|{self.test_set}|tau_dec={self.tau_dec:g}|{self.estimator}|gamma={self.gamma}"
        return label if self.epsilon == 1.0 else f"{label}|{self.lenience} eps={self.epsilon:g}"


@dataclass(frozen=True)
class EvalSettings:
    repeats: int
    max_new_tokens: int
    empirical_prompts: int
    seed: int = 0
    cost_ratio: float | None = None  # c, used by every analytic cell (measured once, or the spec's)
    batch_size: int = 16


@dataclass(frozen=True)
class CostRatio:
    """c = latency of one draft step / one target step, with the 95% interval of the measurement."""

    value: float
    ci95: float  # half-width; 0 when fixed by the spec
    steps: int  # timed step pairs (0 when fixed)
    source: Literal["measured", "fixed"]
    device: str = "cpu"
    key: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> CostRatio:
        """Read `to_json`'s object (cost_ratio.json, a sweep's MLflow records)."""
        return cls(**payload)

    def describe(self) -> str:
        """How c was obtained, in one line: the CLI's, the sweep log's and the report header's."""
        if self.source == "fixed":
            return f"c = {self.value:.4g} (fixed by eval.draft_cost_ratio)"
        return (
            f"c = {self.value:.4f} ± {self.ci95:.4f} (95%, {self.steps} interleaved step pairs on "
            f"{self.device}; ±{100 * self.ci95 / self.value:.1f}%)"
        )


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
    lenience: str | None = None  # records saved before lenience existed are lossless
    epsilon: float = 1.0

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
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> CellRecord:
        return cls(**payload)

    def flat(self) -> dict[str, Any]:
        """Coordinates and metrics in one flat dict (a report row; lists such as β per position kept)."""
        coordinates = {k: v for k, v in asdict(self).items() if k not in ("metrics", "key_inputs")}
        return coordinates | self.metrics
