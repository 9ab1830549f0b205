"""Every MLflow call in specray lives here.

Layout of a sweep in MLflow (experiment = the sweep's name, or `tracking.experiment`):
- one parent run per sweep invocation, tagged `specray.role=sweep` and `specray.sweep_key=<hash of the
  resolved spec>`, with the resolved spec as params (flattened: `eval.gamma`, ...) and as `spec.yaml`;
  figures and tables of the report are its artifacts. Re-running a sweep whose parent did not finish
  resumes that parent instead of starting another;
- one child run per draft (`mlflow.parentRunId` set), tagged `draft`, `paradigm`, `tau_kd`, `mixture`, with
  its training curves (metrics with steps) and one metric per evaluation cell, named
  `<metric>/<test_set>/tau_dec_<x>` (MLflow metric names cannot contain "=").

`specray tune` uses the same experiment: one parent run per search (`specray.role=tune`), one child run
per Tune trial (`specray.role=trial`, tag `trial_id`; its config as params, its curves as metrics, the
best one tagged `specray.best=true`), one child run per baseline draft, and the winner's draft registered
in the Model Registry with its mixture in the version's tags.

What the UI shows (MLflow 3.17): the experiment is tagged a model-development one (`mlflow.experimentKind`)
and described (`mlflow.note.content`); runs are named for people (`tiny · online τ_kd=0.6`) and described;
the data a run used are its dataset inputs (name, content key as digest, context); every finished draft is
a logged model (a thin pyfunc over its HF folder, the KD recipe in its metadata and params) linked to its
run and, for the tuned winner, to its registered version; and a saved runs view (an experiment tag the UI
lists under "Views") shows the drafts ranked, with the columns a user compares.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import re
import socket
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow.artifacts
import requests
import urllib3.exceptions
from mlflow.entities import (
    Dataset,
    DatasetInput,
    InputTag,
    LoggedModelOutput,
    LoggedModelStatus,
    Metric,
    Param,
    RunStatus,
    RunTag,
)
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

from specray.config import SweepSpec, dump_spec
from specray.errors import SpecError, TrackingError, find_cause
from specray.lineage import DatasetRef, DraftModel, RunsView, model_name, run_title

if TYPE_CHECKING:
    from specray.specdec.records import CellRecord

log = logging.getLogger(__name__)

ACCEPTANCE_RATE = "acceptance_rate"
DRAFT_ACCEPTANCE = "draft_acceptance"
BLOCK_EFFICIENCY = "block_efficiency"
SPEEDUP_MODEL = "speedup_model"
SPEEDUP = "speedup"
EMPIRICAL_ACCEPTANCE_RATE = "empirical_acceptance_rate"
EMPIRICAL_BLOCK_EFFICIENCY = "empirical_block_efficiency"
# what servers report (vLLM's definitions, DESIGN.md); analytic ones expected from β, like speedup_model
MEAN_ACCEPTANCE_LENGTH = "mean_acceptance_length"
EMPIRICAL_MEAN_ACCEPTANCE_LENGTH = "empirical_mean_acceptance_length"
DRAFT_ACCEPTANCE_MODEL = "draft_acceptance_model"
ACCEPTANCE_PER_POSITION = "acceptance_per_position"  # one metric per draft position: .../position_<k>
EMPIRICAL_ACCEPTANCE_PER_POSITION = "empirical_acceptance_per_position"
# task quality of decoded outputs (specray/quality.py: exact match or ROUGE-L per test set), and the two
# ends: the target and the draft decoding alone
QUALITY, QUALITY_TARGET, QUALITY_DRAFT = "quality", "quality_target_only", "quality_draft_only"
# record field -> metric name, per estimator (analytic block efficiency: the per-position simulation)
CELL_METRICS = {
    "analytic": {
        "acceptance_rate": ACCEPTANCE_RATE,
        "block_efficiency_simulated": BLOCK_EFFICIENCY,
        "speedup_model": SPEEDUP_MODEL,
        "mean_acceptance_length": MEAN_ACCEPTANCE_LENGTH,
        "draft_acceptance": DRAFT_ACCEPTANCE_MODEL,
        "acceptance_per_position": ACCEPTANCE_PER_POSITION,
    },
    "empirical": {
        "acceptance_rate": EMPIRICAL_ACCEPTANCE_RATE,
        "draft_acceptance": DRAFT_ACCEPTANCE,
        "block_efficiency": EMPIRICAL_BLOCK_EFFICIENCY,
        "speedup": SPEEDUP,
        "mean_acceptance_length": EMPIRICAL_MEAN_ACCEPTANCE_LENGTH,
        "acceptance_per_position": EMPIRICAL_ACCEPTANCE_PER_POSITION,
        "quality": QUALITY,
    },
    "ends": {"quality_target": QUALITY_TARGET, "quality_draft": QUALITY_DRAFT},
}
ROLE, SWEEP_KEY, PARENT = "specray.role", "specray.sweep_key", "mlflow.parentRunId"
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

    @classmethod
    def of(cls, spec: SweepSpec) -> CellAxes:
        e = spec.eval
        return cls(len(e.gamma) > 1, len(e.lenience.epsilon) > 1, len(e.lenience.function) > 1)


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
    for field, metric in names.items():
        value = record.metrics.get(field)
        key = cell_key(metric, record.test_set, record.tau_dec, gamma, epsilon, lenience)
        # a list is one value per draft position (records saved before a field existed lack it)
        named = (
            {f"{key}/position_{k + 1}": v for k, v in enumerate(value)}
            if isinstance(value, list)
            else {key: value}
        )
        points |= {k: float(v) for k, v in named.items() if v is not None and math.isfinite(float(v))}
    return points


def sweep_key(spec: SweepSpec, with_tune: bool = False) -> str:
    """Identity of a sweep's work: every setting that changes a result, the grid or the report (with
    `with_tune`, the search too); not where it is tracked or how it runs (`specray.keys.spec_key`)."""
    from specray.keys import spec_key

    return spec_key(spec, with_tune)


def flatten(node: Any, prefix: str = "") -> dict[str, str]:
    """`{"eval": {"gamma": 4}}` -> `{"eval.gamma": "4"}`; lists stay JSON."""
    if isinstance(node, dict):
        out: dict[str, str] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    text = json.dumps(node) if isinstance(node, list | bool) or node is None else str(node)
    return {prefix.rstrip("."): text[:MAX_PARAM_LENGTH]}


class Tracker:
    """A sweep's MLflow experiment, with run lookup by tags so a resumed sweep finds its own runs."""

    def __init__(self, uri: str, experiment: str):
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._call(self._experiment, experiment)
        self.sweep = experiment  # the sweep's name in run titles, once a parent run is known

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (MlflowException, OSError) as e:  # OSError: an unwritable sqlite file, requests' own errors
            log.debug("MLflow call %s at %s failed", getattr(fn, "__name__", fn), self.uri, exc_info=True)
            raise _tracking_error(self.uri, e) from e

    def _experiment(self, name: str) -> str:
        """The experiment, created (or, from before specray tagged it, tagged) as a model-development one."""
        found = self.client.get_experiment_by_name(name)
        if found is None:
            return self.client.create_experiment(name, tags={EXPERIMENT_KIND: MODEL_DEVELOPMENT})
        if EXPERIMENT_KIND not in found.tags:
            self.client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, MODEL_DEVELOPMENT)
        return found.experiment_id

    def _find(self, filter_string: str) -> list:
        return self._call(
            self.client.search_runs,
            [self.experiment_id],
            filter_string,
            order_by=["attributes.start_time DESC"],
        )

    def parent_run(self, spec: SweepSpec) -> tuple[str, bool]:
        """The parent run; an unfinished one with the same sweep key is resumed. -> (run id, resumed)."""
        return self._parent(spec, "sweep", f"{spec.name} · sweep ", resume=True)

    def child_run(
        self, parent_id: str, draft: str, draft_key: str, tags: Mapping[str, str], note: str = ""
    ) -> str:
        """The draft's run under the parent (named `run_title`, described by `note`), identified by its
        draft key, created once."""
        existing = self._find(f"tags.`{PARENT}` = '{parent_id}' AND tags.`{DRAFT_KEY}` = '{draft_key}'")
        if existing:
            return existing[0].info.run_id
        all_tags = {PARENT: parent_id, ROLE: "draft", "draft": draft, DRAFT_KEY: draft_key, **tags}
        all_tags |= {NOTE: note} if note else {}
        title = run_title(self.sweep, tags)
        return self._call(
            self.client.create_run, self.experiment_id, tags=all_tags, run_name=title
        ).info.run_id

    def tune_parent_run(self, spec: SweepSpec, resume: bool) -> tuple[str, bool]:
        """The parent run of a Tune search: with `resume`, the unfinished one of this spec if there is one
        (-> its id, True); otherwise a new one."""
        return self._parent(spec, "tune", f"{spec.name} · tune ", resume)

    def _parent(self, spec: SweepSpec, role: str, name_prefix: str, resume: bool) -> tuple[str, bool]:
        """With `resume`, the newest unfinished run of this role and sweep key, set RUNNING again; else a new
        run with the resolved spec as params and as `spec.yaml`. -> (run id, resumed)."""
        key = sweep_key(spec, with_tune=role == "tune")
        self.sweep = spec.name
        if resume:
            for run in self._find(f"tags.`{ROLE}` = '{role}' AND tags.`{SWEEP_KEY}` = '{key}'"):
                if run.info.status != RunStatus.to_string(RunStatus.FINISHED):
                    self._call(self.client.update_run, run.info.run_id, status="RUNNING")
                    return run.info.run_id, True
        tags = {ROLE: role, SWEEP_KEY: key}
        run = self._call(
            self.client.create_run, self.experiment_id, tags=tags, run_name=f"{name_prefix}{key[:6]}"
        )
        self.log_params(run.info.run_id, flatten(spec.model_dump(mode="json")))
        self._call(self.client.log_text, run.info.run_id, dump_spec(spec), "spec.yaml")
        return run.info.run_id, False

    def trial_run(self, parent_id: str, trial_id: str, name: str, tags: Mapping[str, str]) -> str:
        """A Tune trial's run under the parent, found by its trial id, created once."""
        existing = self._find(f"tags.`{PARENT}` = '{parent_id}' AND tags.`{TRIAL_ID}` = '{trial_id}'")
        if existing:
            return existing[0].info.run_id
        all_tags = {PARENT: parent_id, ROLE: "trial", TRIAL_ID: trial_id, "draft": name, **tags}
        title = f"{run_title(self.sweep, tags)} · trial {trial_id}"
        return self._call(
            self.client.create_run, self.experiment_id, tags=all_tags, run_name=title
        ).info.run_id

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        batch = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()]
        for start in range(0, len(batch), 100):  # MLflow takes at most 100 params per batch
            self._call(self.client.log_batch, run_id, params=batch[start : start + 100])

    def register_draft(self, name: str, run_id: str, model_id: str, tags: Mapping[str, str]) -> str:
        """Register the logged model `model_id` (of `run_id`) as a version of model `name` (created if
        needed), once per run; returns the version."""
        versions = self._call(self.client.search_model_versions, f"name = '{name}' AND run_id = '{run_id}'")
        if versions:
            return str(versions[0].version)
        if not self._call(self.client.search_registered_models, f"name = '{name}'"):
            self._call(self.client.create_registered_model, name)
        # `models:/<id>`, as mlflow.register_model links them; a sqlite registry looks that up through
        # MLflow's global tracking URI, not this client's (a TODO in its sqlalchemy store, 3.17), hence
        # MLflow's own (private) context manager that sets it for the call
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri

        create, source = self.client.create_model_version, f"models:/{model_id}"
        with _use_tracking_uri(self.uri):
            version = self._call(create, name, source, run_id, tags=dict(tags), model_id=model_id)
        link = json.dumps([{"name": name, "version": str(version.version)}])  # the model's side of the link
        self._call(self.client.set_logged_model_tags, model_id, {MLFLOW_MODEL_VERSIONS: link})
        return str(version.version)

    def log_datasets(self, run_id: str, datasets: Sequence[DatasetRef]) -> None:
        """`datasets` as the run's inputs (each once: a resumed sweep logs only what is missing)."""
        have = {(i.dataset.name, i.dataset.digest) for i in self.run(run_id).inputs.dataset_inputs}
        inputs = [_dataset_input(d) for d in datasets if (d.name, d.digest) not in have]
        if inputs:
            self._call(self.client.log_inputs, run_id, datasets=inputs)

    def log_draft_model(self, run_id: str, model: DraftModel) -> str:
        """The draft as a logged model of `run_id`, once: an `MLmodel` (a pyfunc whose loader reads the HF
        folder, the recipe as metadata) beside the HF folder, uploaded once (the run holds no other copy).
        A model a killed driver left unfinished is deleted and logged again. Returns the model id."""
        query = f"source_run_id = '{run_id}' AND tags.`{DRAFT_KEY}` = '{model.key}'"
        for found in self._call(self.client.search_logged_models, [self.experiment_id], filter_string=query):
            if found.status == LoggedModelStatus.READY:
                return found.model_id
            self._call(self.client.delete_logged_model, found.model_id)
        logged = self._call(
            self.client.create_logged_model,
            self.experiment_id,
            name=model_name(self.sweep, model.draft),
            source_run_id=run_id,
            tags={DRAFT_KEY: model.key, "draft": model.draft, **model.tags},
            params=flatten(dict(model.recipe)),
            model_type=MODEL_TYPE,
        )
        self._call(self.client.log_outputs, run_id, [LoggedModelOutput(logged.model_id, step=0)])
        with tempfile.TemporaryDirectory() as tmp:
            path = _mlmodel_file(logged, run_id, model, Path(tmp))
            self._call(self.client.log_model_artifact, logged.model_id, str(path))
        self._call(self.client.log_model_artifacts, logged.model_id, str(model.folder), DRAFT_DIR)
        self._call(self.client.finalize_logged_model, logged.model_id, LoggedModelStatus.READY)
        return logged.model_id

    def describe_experiment(self, note: str) -> None:
        self._call(self.client.set_experiment_tag, self.experiment_id, NOTE, note)

    def save_runs_view(self, view: RunsView) -> None:
        """`view` among the experiment's saved runs views (replacing an older one with its id)."""
        state = {"selectedColumns": list(view.columns), "orderByKey": view.order_by, "orderByAsc": False}
        now = _now_ms()
        envelope = {"name": view.name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
        tag = SAVED_VIEW + view.view_id
        self._call(self.client.set_experiment_tag, self.experiment_id, tag, json.dumps(envelope))

    def runs_page(self, view_id: str) -> str:
        """The UI's address of the experiment's runs table in `view_id` (a server's own address; for a
        database, where `mlflow ui` serves by default). 3.17's UI opens an experiment on the GenAI pages
        unless told `workflowType=machine_learning` (its sidebar switch, remembered by the browser)."""
        served = self.uri.startswith(("http://", "https://"))
        page = f"{self.uri.rstrip('/') if served else 'http://127.0.0.1:5000'}/#/experiments/{self.experiment_id}"
        return f"{page}/runs?workflowType=machine_learning&{VIEW_PARAM}={view_id}"

    def children(self, parent_id: str) -> list:
        return self._find(f"tags.`{PARENT}` = '{parent_id}'")

    def metric_keys(self, run_id: str) -> set[str]:
        return set(self._call(self.client.get_run, run_id).data.metrics)

    def _log_batch(self, run_id: str, points: Iterable[tuple[str, float, int]]) -> None:
        """(name, value, step) points, in MLflow's batches of at most 1000 metrics."""
        now = _now_ms()
        batch = [Metric(metric_key(name), float(value), now, step) for name, value, step in points]
        for start in range(0, len(batch), 1000):
            self._call(self.client.log_batch, run_id, metrics=batch[start : start + 1000])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        self._log_batch(run_id, ((k, v, step) for k, v in metrics.items()))

    def log_curves(self, run_id: str, curves: Iterable[Mapping[str, Any]]) -> None:
        """Training curves: every numeric field of each report, at its `step`."""
        self._log_batch(
            run_id,
            (
                (k, v, int(row["step"]))
                for row in curves
                for k, v in row.items()
                if k != "step" and isinstance(v, int | float) and math.isfinite(v)
            ),
        )

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self._call(self.client.log_batch, run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifacts(self, run_id: str, local_dir: Path, artifact_path: str | None = None) -> None:
        self._call(self.client.log_artifacts, run_id, str(local_dir), artifact_path)

    def artifact_paths(self, run_id: str) -> set[str]:
        """Top-level artifact paths of a run."""
        return {item.path for item in self._call(self.client.list_artifacts, run_id)}

    def log_dict(self, run_id: str, payload: Any, artifact_file: str) -> None:
        self._call(self.client.log_dict, run_id, payload, artifact_file)

    def download(self, run_id: str, path: str, destination: Path) -> Path:
        return Path(self._call(self.client.download_artifacts, run_id, path, str(destination)))

    def finish(self, run_id: str, ok: bool = True) -> None:
        self._call(self.client.set_terminated, run_id, "FINISHED" if ok else "FAILED")

    def run(self, run_id: str):
        return self._call(self.client.get_run, run_id)

    # ------------------------------------------------------------ serving export (`specray export`)

    def download_draft(self, parent_id: str, draft_key: str, destination: Path) -> Path:
        """The HF folder of the draft with this key: the `draft/` folder of the logged model its child run
        of `parent_id` logged (`log_draft_model`)."""
        runs = self._find(f"tags.`{PARENT}` = '{parent_id}' AND tags.`{DRAFT_KEY}` = '{draft_key}'")
        query = f"tags.`{DRAFT_KEY}` = '{draft_key}'"
        for run in runs:
            found = self._call(
                self.client.search_logged_models,
                [self.experiment_id],
                filter_string=f"source_run_id = '{run.info.run_id}' AND {query}",
            )
            ready = [m for m in found if m.status == LoggedModelStatus.READY]
            if ready:
                destination.mkdir(parents=True, exist_ok=True)
                uri = f"{ready[0].artifact_location.rstrip('/')}/{DRAFT_DIR}"
                return Path(
                    self._call(
                        mlflow.artifacts.download_artifacts,
                        artifact_uri=uri,
                        dst_path=str(destination),
                        tracking_uri=self.uri,
                    )
                )
        raise SpecError(f"run {parent_id}: no child run has a logged model of the draft with key {draft_key}")

    def sweep_run(self, key: str) -> str | None:
        """The newest parent run of the sweep with this key (finished or not), or None."""
        runs = self._find(f"tags.`{ROLE}` = 'sweep' AND tags.`{SWEEP_KEY}` = '{key}'")
        return runs[0].info.run_id if runs else None

    def export_run(self, key: str, name: str, parent_id: str | None, folder: Path) -> str:
        """A finished run (under the sweep's parent run when there is one) holding an export folder as its
        `export` artifact: the routing plan, the drafts with their metadata, the engines' settings."""
        tags = {ROLE: "export", SWEEP_KEY: key} | ({PARENT: parent_id} if parent_id else {})
        run_id = self._call(self.client.create_run, self.experiment_id, tags=tags, run_name=name).info.run_id
        self.log_artifacts(run_id, folder, "export")
        self.finish(run_id)
        return run_id

    def register_version(self, name: str, run_id: str, artifact_path: str, tags: Mapping[str, str]) -> str:
        """A version of registered model `name` (created if needed) for this run's artifact; returns it."""
        source = f"runs:/{run_id}/{artifact_path}"
        if not self._call(self.client.search_registered_models, f"name = '{name}'"):
            self._call(self.client.create_registered_model, name)
        version = self._call(self.client.create_model_version, name, source, run_id, tags=dict(tags))
        return str(version.version)

    def set_aliases(self, name: str, aliases: Mapping[str, str | None]) -> None:
        """Point each alias at its version; an alias mapped to None is removed (if it was set)."""
        current = self._call(self.client.get_registered_model, name).aliases
        for alias, version in aliases.items():
            if version is not None:
                self._call(self.client.set_registered_model_alias, name, alias, version)
            elif alias in current:
                self._call(self.client.delete_registered_model_alias, name, alias)

    def version_by_alias(self, name: str, alias: str) -> tuple[str, str]:
        """(version, source) that alias `alias` of registered model `name` points at."""
        version = self._call(self.client.get_model_version_by_alias, name, alias)
        return str(version.version), version.source


def open_tracker(uri: str, experiment: str) -> Tracker:
    """A Tracker, or a SpecError naming the URI when MLflow cannot be reached before any work starts."""
    _probe_server(uri)
    try:
        return Tracker(uri, experiment)
    except TrackingError as e:
        raise SpecError(f"tracking.uri: {e}") from None


def _probe_server(uri: str, timeout_s: float = 10.0) -> None:
    """One quick request to an MLflow server before any work starts. MLflow's own client retries a refused
    connection for minutes (MLFLOW_HTTP_REQUEST_MAX_RETRIES, which rides out a short outage mid-run);
    at start a server that is not there should be reported at once."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        requests.get(f"{uri.rstrip('/')}/health", timeout=timeout_s)  # any answer means a server is there
    except requests.RequestException as e:
        log.debug("MLflow server probe at %s failed", uri, exc_info=True)
        reason = _connection_failure(e) or type(e).__name__
        raise SpecError(
            f"tracking.uri: no MLflow server answers at {uri} ({reason}); "
            "start it (e.g. `mlflow server --host 127.0.0.1 --port PORT`) or use tracking.uri=sqlite:///mlflow.db"
        ) from None


def _tracking_error(uri: str, error: Exception) -> TrackingError:
    """One line for the user naming the server and what went wrong; the raw error stays in the debug log."""
    reason = _connection_failure(error)
    if reason:
        return TrackingError(f"MLflow at {uri} stopped answering ({reason})")
    if isinstance(error, MlflowException):  # the server answered, and refused the call
        return TrackingError(f"MLflow at {uri}: {error.message.splitlines()[0]}")
    return TrackingError(f"MLflow at {uri} is unreachable ({error})")


_HTTP_ERRORS = "HTTP error responses"
_TOO_MANY_STATUS = re.compile(r"too many (\d{3}) error responses")  # urllib3's ResponseError keeps only this
# (exception types in the cause chain, few words), most telling first. A dying server shows as any of the
# connection errors: refused once it is gone, reset or closed with a request in flight, a broken pipe
# mid-upload, an answer cut short when it dies while writing one. urllib3's NewConnectionError is one of
# its TimeoutErrors, so timeouts are the socket's own.
_FAILURE_TYPES: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((socket.gaierror,), "host name not found"),
    ((TimeoutError, requests.Timeout, urllib3.exceptions.ReadTimeoutError), "timed out"),
    ((ConnectionRefusedError,), "connection refused"),
    ((http.client.RemoteDisconnected,), "connection closed"),  # a ConnectionResetError: test it first
    ((ConnectionResetError,), "connection reset"),
    ((ConnectionAbortedError, BrokenPipeError), "connection aborted"),
    # the server went away between the answer's headers and the end of its body
    ((http.client.IncompleteRead, urllib3.exceptions.IncompleteRead), "answer cut short"),
    ((requests.exceptions.RetryError, urllib3.exceptions.ResponseError), _HTTP_ERRORS),
    ((requests.ConnectionError, urllib3.exceptions.ProtocolError), "connection failed"),
)
# the same causes as urllib3 and the socket word them, for the one place MLflow keeps only the text: failed
# artifact downloads, gathered into one message
_FAILURE_TEXTS = (
    (
        re.compile(r"Failed to resolve|Name or service not known|Temporary failure in name resolution"),
        "host name not found",
    ),
    (re.compile(r"Read timed out|connect timeout="), "timed out"),
    (re.compile(r"Connection refused"), "connection refused"),
    (re.compile(r"RemoteDisconnected|Remote end closed connection"), "connection closed"),
    (re.compile(r"Connection reset by peer"), "connection reset"),
    (re.compile(r"Broken pipe|ConnectionAbortedError"), "connection aborted"),
    (re.compile(r"IncompleteRead"), "answer cut short"),
    (_TOO_MANY_STATUS, _HTTP_ERRORS),
)


def _connection_failure(error: BaseException) -> str | None:
    """Why a tracking server did not answer, in a few words (`connection reset`, `HTTP 503`), or None when
    it did answer. Read from the exception types in the cause chain (MLflow wraps requests, which wraps
    urllib3, which wraps the socket's error); from the text only where MLflow kept nothing else."""
    for types, words in _FAILURE_TYPES:
        cause = find_cause(error, types)
        if cause is not None:
            return _with_status(words, str(cause))
    text = str(error)
    return next(
        (_with_status(words, text) for pattern, words in _FAILURE_TEXTS if pattern.search(text)), None
    )


def _with_status(words: str, text: str) -> str:
    """`HTTP error responses` -> `HTTP 503` when urllib3's message names the status."""
    status = _TOO_MANY_STATUS.search(text) if words == _HTTP_ERRORS else None
    return f"HTTP {status.group(1)}" if status else words


def _now_ms() -> int:
    return int(time.time() * 1000)


def _dataset_input(d: DatasetRef) -> DatasetInput:
    source, profile = json.dumps({"uri": d.source}), json.dumps({"num_rows": d.rows})
    dataset = Dataset(d.name, d.digest, d.source_type, source, profile=profile)
    return DatasetInput(dataset, [InputTag(DATA_CONTEXT, d.context)])


def _mlmodel_file(logged: Any, run_id: str, model: DraftModel, folder: Path) -> Path:
    """The `MLmodel` of a draft's logged model: a pyfunc flavour (`specray.models.pyfunc` loads the HF
    folder at `draft/`) and the KD recipe as metadata."""
    from mlflow.models import Model, ModelSignature
    from mlflow.pyfunc import add_to_model
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    metadata = {"specray": {"draft": model.draft, "draft_key": model.key, "recipe": dict(model.recipe)}}
    params = ParamSchema([ParamSpec("temperature", "double", 0.0), ParamSpec("max_new_tokens", "long", 48)])
    text = Schema([ColSpec("string")])  # prompts in, responses out
    signature = ModelSignature(inputs=text, outputs=text, params=params)
    ids = {"model_uuid": logged.model_id, "model_id": logged.model_id}
    mlmodel = Model(logged.artifact_location, run_id, signature=signature, metadata=metadata, **ids)
    add_to_model(mlmodel, loader_module=PYFUNC_LOADER, data=DRAFT_DIR)
    path = folder / "MLmodel"
    mlmodel.save(str(path))
    return path


def fetch_sweep_records(uri: str, run_id: str, destination: Path) -> dict[str, Any]:
    """The plain records a sweep's parent run holds (cells, drafts, curves, lengths), from MLflow."""
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
        folder = Path(client.download_artifacts(run_id, "records", str(destination)))
    except MlflowException as e:
        raise SpecError(f"run {run_id} at {uri}: {e.message.splitlines()[0]}") from None
    if run.data.tags.get(ROLE) != "sweep":
        raise SpecError(f"run {run_id} is not a specray sweep's parent run (tag {ROLE} is not 'sweep')")
    records = {path.stem: json.loads(path.read_text()) for path in folder.glob("*.json")}
    records["lengths"] = {
        k: {float(t): v for t, v in by.items()} for k, by in records.get("lengths", {}).items()
    }
    records["name"] = run.data.params.get("name", run_id)
    records["experiment"] = client.get_experiment(run.info.experiment_id).name
    projected = run.data.params.get("eval.projected_cost_ratio", "null")
    records["projected_cost_ratio"] = None if projected in ("null", "None") else float(projected)
    return records
