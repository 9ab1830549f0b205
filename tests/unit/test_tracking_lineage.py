"""What MLflow shows of a sweep, against a real (sqlite) tracking store: a model-development experiment,
run names and descriptions for people, datasets keyed by content, each draft a logged model that loads
back as a pyfunc, the tuned winner registered from its logged model, and the saved runs view."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
from mlflow.entities import LoggedModelStatus

from specray.config import load_spec
from specray.keys import train_shard_keys
from specray.sweep.plan import plan_sweep
from specray.sweep.tracked import sweep_data
from specray.tracking.client import Tracker, describe_sweep
from specray.tracking.lineage import DRAFTS_VIEW, DatasetRef, DraftModel, draft_note, runs_view
from specray.tracking.names import (
    DRAFT_DIR,
    EXPERIMENT_KIND,
    MODEL_DEVELOPMENT,
    NOTE,
    SAVED_VIEW,
    model_name,
    run_title,
)
from tests.conftest import REPO
from tests.servers import QUIET
from tests.stores import new_store

SMOKE = load_spec(REPO / "sweeps" / "smoke.yaml")
TAGS = {"paradigm": "online", "tau_kd": "0.6", "mixture": "0.6:1"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One sqlite store for the module (tests/stores.py); each test has its own runs."""
    folder = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # the store's artifacts (./mlruns) stay in the test's folder
        for name, value in QUIET.items():
            patch.setenv(name, value)
        yield new_store(folder)


@pytest.fixture
def tracker(store: str) -> Tracker:
    return Tracker(store, "smoke")


def _draft_run(tracker: Tracker) -> str:
    parent = tracker.client.create_run(tracker.experiment_id, run_name="parent").info.run_id
    tracker.sweep = "smoke"
    return tracker.child_run(parent, "online/tau_kd=0.6", "key-0.6", TAGS, note="**online** draft")


def test_experiments_are_model_development_ones(tracker: Tracker) -> None:
    client = tracker.client
    assert client.get_experiment(tracker.experiment_id).tags[EXPERIMENT_KIND] == MODEL_DEVELOPMENT
    older = client.create_experiment("made-before")  # an experiment from before specray tagged them
    assert EXPERIMENT_KIND not in client.get_experiment(older).tags
    Tracker(tracker.uri, "made-before")
    assert client.get_experiment(older).tags[EXPERIMENT_KIND] == MODEL_DEVELOPMENT


def test_runs_have_names_and_descriptions_for_people(tracker: Tracker) -> None:
    run = tracker.run(_draft_run(tracker))
    assert run.info.run_name == "smoke · online τ_kd=0.6"
    assert run.data.tags[NOTE] == "**online** draft" and run.data.tags["draft"] == "online/tau_kd=0.6"
    assert run_title("tiny", {"paradigm": "offline", "tau_kd": "", "mixture": "0.7:1,0.9:1"}) == (
        "tiny · offline mix 0.7:1,0.9:1"
    )
    assert run_title("tiny", {"paradigm": "none", "tau_kd": "", "mixture": ""}) == "tiny · non-distill"
    assert model_name("tiny", "online/mix=0.7:1,0.9:1") == "tiny-online-mix=0_7x1,0_9x1"


def test_datasets_are_logged_once_with_their_content_keys(tracker: Tracker) -> None:
    run_id = _draft_run(tracker)
    shard = DatasetRef("teacher τ_kd=0.6", "a" * 24, "training", "/cache/shards/aaaa", 64)
    test = DatasetRef("in_domain test", "b" * 20, "evaluation", "synthetic corpus", 16, "code")
    tracker.log_datasets(run_id, [shard])
    tracker.log_datasets(run_id, [shard, test])  # a resumed sweep: only what is missing is added
    inputs = tracker.run(run_id).inputs.dataset_inputs
    assert sorted((i.dataset.name, i.dataset.digest) for i in inputs) == [
        ("in_domain test", "b" * 20),
        ("teacher τ_kd=0.6", "a" * 24),
    ]
    by_name = {i.dataset.name: i for i in inputs}
    assert [(t.key, t.value) for t in by_name["teacher τ_kd=0.6"].tags] == [
        ("mlflow.data.context", "training")
    ]
    assert json.loads(by_name["in_domain test"].dataset.profile) == {"num_rows": 16}
    assert json.loads(by_name["teacher τ_kd=0.6"].dataset.source) == {"uri": "/cache/shards/aaaa"}


def test_a_draft_is_a_logged_model_that_loads_back(tracker: Tracker, micro_zoo) -> None:
    run_id = _draft_run(tracker)
    recipe = {"distill.lr": 0.001, "paradigm": "online", "shards": {"0.6": "a" * 24}}
    draft = DraftModel("online/tau_kd=0.6", "key-0.6", Path(micro_zoo.draft), recipe, TAGS)
    model_id = tracker.log_draft_model(run_id, draft)
    assert tracker.log_draft_model(run_id, draft) == model_id  # once per run and draft key

    model = tracker.client.get_logged_model(model_id)
    assert model.status == LoggedModelStatus.READY and model.name == "smoke-online-tau_kd=0_6"
    assert model.source_run_id == run_id and model.params["shards.0.6"] == "a" * 24
    assert [o.model_id for o in tracker.run(run_id).outputs.model_outputs] == [model_id]  # the Models column
    files = {Path(f.path).name for f in tracker.client.list_logged_model_artifacts(model_id, DRAFT_DIR)}
    assert files == {p.name for p in Path(micro_zoo.draft).iterdir()}  # the HF folder as it is
    assert not tracker.artifact_paths(run_id)  # and no second copy among the run's artifacts

    mlflow.set_tracking_uri(tracker.uri)
    try:
        loaded = mlflow.pyfunc.load_model(f"models:/{model_id}")
        responses = loaded.predict(["Name a color.", "Add 2 and 3."], params={"max_new_tokens": 4})
    finally:
        mlflow.set_tracking_uri(None)
    assert loaded.metadata.metadata["specray"]["recipe"] == recipe
    assert len(responses) == 2 and all(isinstance(r, str) for r in responses)


def test_an_unfinished_model_is_replaced(tracker: Tracker, micro_zoo) -> None:
    """A driver killed mid-upload leaves a PENDING model; the resumed sweep logs the draft again."""
    run_id = _draft_run(tracker)
    client = tracker.client
    left = client.create_logged_model(
        tracker.experiment_id, source_run_id=run_id, tags={"specray.draft_key": "key-0.6"}
    )
    draft = DraftModel("online/tau_kd=0.6", "key-0.6", Path(micro_zoo.draft), {}, TAGS)
    model_id = tracker.log_draft_model(run_id, draft)
    assert model_id != left.model_id
    alive = client.search_logged_models([tracker.experiment_id], filter_string=f"source_run_id = '{run_id}'")
    assert [m.model_id for m in alive] == [model_id]


def test_the_winner_is_registered_from_its_logged_model(tracker: Tracker, micro_zoo) -> None:
    run_id = _draft_run(tracker)
    draft = DraftModel("online/tau_kd=0.6", "key-0.6", Path(micro_zoo.draft), {}, TAGS)
    model_id = tracker.log_draft_model(run_id, draft)
    version = tracker.register_draft("smoke-tuned-draft", run_id, model_id, {"mixture": "0.6:1"})
    assert tracker.register_draft("smoke-tuned-draft", run_id, model_id, {}) == version  # once
    registered = tracker.client.get_model_version("smoke-tuned-draft", version)
    assert registered.source == f"models:/{model_id}" and registered.run_id == run_id
    links = json.loads(tracker.client.get_logged_model(model_id).tags["mlflow.modelVersions"])
    assert links == [{"name": "smoke-tuned-draft", "version": version}]


def test_the_drafts_view_and_the_page_that_opens_it(tracker: Tracker) -> None:
    view = runs_view(SMOKE)
    tracker.save_runs_view(view)
    envelope = json.loads(tracker.client.get_experiment(tracker.experiment_id).tags[SAVED_VIEW + DRAFTS_VIEW])
    assert envelope["name"] == "specray: drafts" and isinstance(envelope["createdAt"], int)
    state = json.loads(envelope["state"])
    assert state["orderByKey"] == "metrics.`speedup_model/in_domain/tau_dec_1`" and not state["orderByAsc"]
    assert "attributes.`Models`" in state["selectedColumns"]
    assert "metrics.`acceptance_rate/in_domain/tau_dec_0`" in state["selectedColumns"]
    page = tracker.runs_page(DRAFTS_VIEW)
    assert page == (
        f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs"
        f"?workflowType=machine_learning&viewStateShareKey={DRAFTS_VIEW}"
    )


def test_the_sweeps_datasets_carry_the_cache_keys() -> None:
    plan = plan_sweep(SMOKE)
    data = sweep_data(plan)
    keys = train_shard_keys(SMOKE)
    assert {tau: ref.digest for tau, ref in data.shards.items()} == {tau: k.digest for tau, k in keys.items()}
    assert {ref.name: ref.digest for ref in data.tests} == {
        f"{name} test": prompts.key for name, prompts in plan.prompt_sets.items()
    }
    assert data.train.rows == SMOKE.data.train_size and data.train.context == "generation"
    offline_1 = next(p for p in plan.drafts if p.paradigm == "offline" and p.tau_kd == 1.0)
    assert [d.name for d in data.for_draft(offline_1.mixture)] == [
        "teacher τ_kd=1",
        "in_domain test",
        "out_of_domain test",
    ]
    assert "τ_kd=1" in draft_note(SMOKE, offline_1) and offline_1.key in draft_note(SMOKE, offline_1)
    assert "un-distilled" in draft_note(SMOKE, plan.baseline)


def test_a_sweep_is_described_before_any_work(tracker: Tracker) -> None:
    parent, _ = tracker.parent_run(SMOKE)
    data = sweep_data(plan_sweep(SMOKE))
    describe_sweep(tracker, parent, SMOKE, data, drafts=4)
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert "Model training" in experiment.tags[NOTE] and SAVED_VIEW + DRAFTS_VIEW in experiment.tags
    run = tracker.run(parent)
    assert run.info.run_name.startswith("smoke · sweep ") and "4 drafts" in run.data.tags[NOTE]
    logged = sorted((i.dataset.name, i.dataset.digest) for i in run.inputs.dataset_inputs)
    assert logged == sorted((d.name, d.digest) for d in data.datasets())
