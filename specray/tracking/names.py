"""The names specray gives things in MLflow: the keys a cell's metrics are logged under (built from the
metric names of `specray.metrics`), tags, params and run names. Plain strings and the functions that build
them; no MLflow import.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specray.metrics import BY_CATEGORY, CATEGORY_FIGURES, CELL_METRICS, SPEEDUP_MODEL, SPEEDUP_MODEL_BY_BATCH
from specray.names import BASELINE

if TYPE_CHECKING:
    from specray.config import SweepSpec
    from specray.specdec.records import CellRecord

ROLE, SPEC_KEY, PARENT = "specray.role", "specray.spec_key", "mlflow.parentRunId"
DRAFT_KEY = "specray.draft_key"
BEST, TRIAL_ID = "specray.best", "trial_id"
MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value
NOTE = "mlflow.note.content"  # a run's or experiment's description, Markdown
# the experiment kind MLflow 3's UI reads (`mlflow.experimentKind`, values in its JS: genai_development,
# custom_model_development); 3.17's UI routes by its sidebar switch instead (`runs_page` says how to open)
EXPERIMENT_KIND, MODEL_DEVELOPMENT = "mlflow.experimentKind", "custom_model_development"
DATA_CONTEXT = "mlflow.data.context"  # training | evaluation | generation, shown beside a dataset's name
# Saved runs views: the UI keeps them as experiment tags `mlflow.sharedViewState.<id>` holding
# {name, createdAt, updatedAt, state} and opens one at runs?viewStateShareKey=<id> (not in MLflow's Python
# API; the format is read from 3.17's UI code, where `state` is its runs-table state as JSON).
SAVED_VIEW, VIEW_PARAM = "mlflow.sharedViewState.", "viewStateShareKey"
DRAFT_DIR, MODEL_TYPE = "draft", "specray-draft"  # the HF folder inside a draft's logged model
PYFUNC_LOADER = "specray.models.pyfunc"


def metric_key(name: str) -> str:
    """A metric name MLflow accepts: `acceptance_rate/tau_dec=0.6` becomes `acceptance_rate/tau_dec_0.6`."""
    return name.replace("=", "_")


@dataclass(frozen=True)
class CellAxes:
    """Which grid axes a sweep varies beyond τ_dec, hence name in its cells' metric keys."""

    gamma: bool = False
    epsilon: bool = False
    function: bool = False
    batch: bool = False  # several empirical batch sizes (modelled ones: named whenever there are several)

    @classmethod
    def of(cls, spec: SweepSpec) -> CellAxes:
        e = spec.eval
        several = (
            len(e.lenience.epsilon) > 1,
            len(e.lenience.function) > 1,
            len(e.empirical_batch_sizes) > 1,
        )
        return cls(len(e.gamma) > 1, *several)


def cell_key(
    metric: str,
    test_set: str,
    tau_dec: float,
    gamma: int | None = None,
    epsilon: float | None = None,
    lenience: str | None = None,
) -> str:
    """`speedup_model/in_domain/tau_dec_0.6`, with `/gamma_4` appended when the sweep has several γ, and
    `/eps_0.5` when it has several ε (`/lin_eps_0.5` when it has several lenience functions; a lossless
    cell is `/eps_1` whatever the function)."""
    key = f"{metric}/{test_set}/tau_dec_{tau_dec:g}"
    key = key if gamma is None else f"{key}/gamma_{gamma}"
    if epsilon is None:
        return key
    return f"{key}/{lenience}_eps_{epsilon:g}" if lenience and epsilon < 1.0 else f"{key}/eps_{epsilon:g}"


def cell_metrics(
    record: CellRecord, with_gamma: bool = False, axes: CellAxes | None = None
) -> dict[str, float]:
    """The metrics one evaluation record contributes to its draft's run (`axes`: as well as `with_gamma`,
    which axes the metric names carry)."""
    axes = axes or CellAxes(gamma=with_gamma)
    names = CELL_METRICS[record.estimator]
    gamma = record.gamma if (axes.gamma or with_gamma) and record.estimator != "ends" else None
    epsilon = record.epsilon if (axes.epsilon or axes.function) and record.estimator != "ends" else None
    lenience = record.lenience if axes.function else None
    points: dict[str, float] = {}
    by_batch = record.metrics.get(SPEEDUP_MODEL_BY_BATCH)
    if isinstance(by_batch, dict) and len(by_batch) > 1:  # `speedup_model/.../batch_<B>` at every B
        key = cell_key(SPEEDUP_MODEL, record.test_set, record.tau_dec, gamma, epsilon, lenience)
        points |= {f"{key}/batch_{b}": float(v) for b, v in by_batch.items() if math.isfinite(float(v))}
    batch = f"/batch_{record.batch_size}" if axes.batch and record.estimator == "empirical" else ""
    for field, metric in names.items():
        value = record.metrics.get(field)
        key = cell_key(metric, record.test_set, record.tau_dec, gamma, epsilon, lenience) + batch
        # a list is one value per draft position; a metric the record lacks is not logged
        named = (
            {f"{key}/position_{k + 1}": v for k, v in enumerate(value)}
            if isinstance(value, list)
            else {key: value}
        )
        points |= {k: float(v) for k, v in named.items() if v is not None and math.isfinite(float(v))}
    return points | _category_metrics(record, gamma, epsilon, lenience)


def _category_metrics(
    record: CellRecord, gamma: int | None, epsilon: float | None, lenience: str | None
) -> dict[str, float]:
    """`speedup_model/<test set>/tau_dec_<τ>/category_<name>` for each figure a cell keeps per category
    (`specray.specdec.categories`)."""
    by_category = record.metrics.get(BY_CATEGORY)
    names = CATEGORY_FIGURES.get(record.estimator, {})
    if not isinstance(by_category, dict):
        return {}
    points = {}
    for category, figures in by_category.items():
        for field, value in figures.items():
            if field in names and math.isfinite(float(value)):
                metric = names[field]
                key = cell_key(metric, record.test_set, record.tau_dec, gamma, epsilon, lenience)
                points[f"{key}/category_{category}"] = float(value)
    return points


def garden_metric(point: str, figure: str) -> str:
    """`garden/<point label>/<figure>` on a garden's parent run: `LATENCY_MS_PER_TOKEN` or `QUALITY`."""
    return f"garden/{point}/{figure}"


def flatten(node: Any, prefix: str = "") -> dict[str, str]:
    """`{"eval": {"gamma": 4}}` -> `{"eval.gamma": "4"}`; lists stay JSON."""
    if isinstance(node, dict):
        out: dict[str, str] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    text = json.dumps(node) if isinstance(node, list | bool) or node is None else str(node)
    return {prefix.rstrip("."): text[:MAX_PARAM_LENGTH]}


_MODEL_NAME_FORBIDDEN = re.compile(r"[/:.%\"']")  # characters MLflow refuses in a logged model's name


def run_title(sweep: str, tags: Mapping[str, str]) -> str:
    """A draft run's name for people: `tiny · online τ_kd=0.6`, `tiny · online mix 0.7:1,0.9:1`,
    `tiny · non-distill` (from the draft tags `paradigm`, `tau_kd`, `mixture`)."""
    paradigm = tags.get("paradigm", "none")
    if paradigm == "none":
        return f"{sweep} · {BASELINE}"
    recipe = f"τ_kd={tags['tau_kd']}" if tags.get("tau_kd") else f"mix {tags.get('mixture', '')}"
    return f"{sweep} · {paradigm} {recipe}"


def model_name(sweep: str, draft: str) -> str:
    """A logged model's name MLflow accepts: `tiny-online-tau_kd=0_6` (no `/ : . % " '`)."""
    return _MODEL_NAME_FORBIDDEN.sub(lambda m: {"/": "-", ":": "x"}.get(m.group(), "_"), f"{sweep}-{draft}")
