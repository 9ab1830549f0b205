"""The `Tracker`: one sweep's MLflow experiment and every call specray makes to it (the layout of runs is
in the package's docstring). A failed call raises a TrackingError naming the server (`errors`)."""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow.artifacts
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

from specray.config import dump_spec
from specray.errors import SpecError, TrackingError
from specray.keys import spec_key
from specray.tracking.errors import probe_server, tracking_error
from specray.tracking.lineage import (
    EXPERIMENT_NOTE,
    DatasetRef,
    DraftModel,
    RunsView,
    SweepData,
    runs_view,
    sweep_note,
)
from specray.tracking.names import (
    DATA_CONTEXT,
    DRAFT_DIR,
    DRAFT_KEY,
    EXPERIMENT_KIND,
    MAX_PARAM_LENGTH,
    MODEL_DEVELOPMENT,
    MODEL_TYPE,
    NOTE,
    PARENT,
    PYFUNC_LOADER,
    ROLE,
    SAVED_VIEW,
    SPEC_KEY,
    TRIAL_ID,
    VIEW_PARAM,
    flatten,
    metric_key,
    model_name,
    run_title,
)

if TYPE_CHECKING:
    from specray.config import SweepSpec

log = logging.getLogger(__name__)


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
            raise tracking_error(self.uri, e) from e

    def _experiment(self, name: str) -> str:
        """The experiment, created as a model-development one, or tagged so where it exists untagged (made in
        the UI or by another tool)."""
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
        """The parent run; an unfinished one with the same spec key is resumed. -> (run id, resumed)."""
        return self._parent(spec, "sweep", f"{spec.name} · sweep ", resume=True)

    def garden_run(self, spec: SweepSpec) -> tuple[str, bool]:
        """A model garden's parent run (`specray/garden/`); an unfinished one of the same spec is resumed."""
        return self._parent(spec, "garden", f"{spec.name} · garden ", resume=True)

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
        """With `resume`, the newest unfinished run of this role and spec key, set RUNNING again; else a new
        run with the resolved spec as params and as `spec.yaml`. -> (run id, resumed)."""
        key = spec_key(spec, with_tune=role == "tune")
        self.sweep = spec.name
        if resume:
            for run in self._find(f"tags.`{ROLE}` = '{role}' AND tags.`{SPEC_KEY}` = '{key}'"):
                if run.info.status != RunStatus.to_string(RunStatus.FINISHED):
                    self._call(self.client.update_run, run.info.run_id, status="RUNNING")
                    return run.info.run_id, True
        tags = {ROLE: role, SPEC_KEY: key}
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
        runs = self._find(f"tags.`{ROLE}` = 'sweep' AND tags.`{SPEC_KEY}` = '{key}'")
        return runs[0].info.run_id if runs else None

    def export_run(self, key: str, name: str, parent_id: str | None, folder: Path) -> str:
        """A finished run (under the sweep's parent run when there is one) holding an export folder as its
        `export` artifact: the routing plan, the drafts with their metadata, the engines' settings."""
        tags = {ROLE: "export", SPEC_KEY: key} | ({PARENT: parent_id} if parent_id else {})
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


def open_tracker(uri: str, experiment: str) -> Tracker:
    """A Tracker, or a SpecError naming the URI when MLflow cannot be reached before any work starts."""
    probe_server(uri)
    try:
        return Tracker(uri, experiment)
    except TrackingError as e:
        raise SpecError(f"tracking.uri: {e}") from None


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


def describe_sweep(tracker: Tracker, parent: str, spec: SweepSpec, data: SweepData, drafts: int) -> None:
    """What the UI shows of a sweep before any work: the parent run's description and datasets (`data`),
    and the drafts view."""
    tracker.describe_experiment(EXPERIMENT_NOTE)
    tracker.set_tags(parent, {NOTE: sweep_note(spec, drafts)})
    tracker.log_datasets(parent, data.datasets())
    tracker.save_runs_view(runs_view(spec))
