"""`specray tune` on the micro zoo: real Ray Tune, real MLflow. A search end to end (no teacher during the
search, trials and baselines in MLflow, the winner registered, Table 3), and a killed search resumed — one
search, which both tests read: it is killed mid-search, then stopped by its driver mid-way through the full
budget, then resumed to the end."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from specray.distill.checkpoints import FINISHED_FILE
from specray.names import TUNE_DRAFTS
from specray.report.composition import composition_gains, control_gains
from specray.report.tables import load_composition
from specray.serving.command import run_export
from specray.sweep.tune.run import TuneOutcome
from specray.sweep.tune.trial import DRAFT_DIR, TRIAL_RESULT
from specray.tracking.names import BEST, PARENT, ROLE, TRIAL_ID
from tests.conftest import REPO
from tests.stores import new_store
from tests.sweeps import COARSE_TIMING
from tests.waiting import CLI_TIMEOUT_S, wait_until

pytestmark = pytest.mark.integration
SPECRAY = str(Path(sys.executable).parent / "specray")
SMOKE = REPO / "sweeps" / "smoke.yaml"
WATCHED = Path(__file__).parent / "watched_tune.py"  # the CLI with its driver watched


def micro_overrides(micro_zoo, tmp_path: Path, *extra: str) -> list[str]:
    """The smoke sweep on the micro zoo: 2 steps per trial (a probe at each), 4 at the full budget, one
    objective τ_dec."""
    return [
        f"models.target={{name_or_path: {micro_zoo.target}}}",
        f"models.draft={{name_or_path: {micro_zoo.draft}}}",
        "teacher.max_new_tokens=12",
        "distill.steps=4",
        "distill.batch_size=4",
        "distill.max_new_tokens=8",
        "distill.warmup_steps=1",
        "distill.report_every=1",
        "distill.checkpoint_every=2",
        "eval.temperatures=[0.0,1.0]",
        "eval.max_new_tokens=8",
        "eval.estimators=[analytic]",
        "eval.empirical_temperatures=[]",
        "eval.replicas=1",
        "tune.objective_temperatures=[1.0]",
        "tune.manual_top_k=2",
        "tune.num_samples=3",
        "tune.steps=2",
        "ray.num_cpus=2",
        COARSE_TIMING,
        f"output_dir={tmp_path}",
        f"tracking.uri={new_store(tmp_path)}",
        *extra,
    ]


def runs_by_role(uri: str, experiment: str) -> dict[str, list]:
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    grouped: dict[str, list] = {}
    for run in runs:
        grouped.setdefault(run.data.tags.get(ROLE, ""), []).append(run)
    return grouped


def finished_markers(folder: Path) -> dict[str, int]:
    """Every published draft under `folder` -> its completion marker's mtime."""
    return {str(p.parent): p.stat().st_mtime_ns for p in folder.rglob(FINISHED_FILE)}


def finished_trials(tmp_path: Path) -> dict[str, tuple[int, int]]:
    """Trials that measured their objective -> (mtime of that record, mtime of the draft's marker)."""
    found = {}
    for record in (tmp_path / "smoke" / "tune" / "trials").glob(f"*/{TRIAL_RESULT}"):
        marker = record.parent / DRAFT_DIR / FINISHED_FILE
        found[record.parent.name] = (record.stat().st_mtime_ns, marker.stat().st_mtime_ns)
    return found


def saved_as_terminated(tmp_path: Path, trial_ids: set[str]) -> bool:
    """Tune's own experiment state on disk records these trials as finished."""
    states = sorted((tmp_path / "smoke" / "tune" / "search").glob("experiment_state-*.json"))
    try:
        trial_data = json.loads(states[-1].read_text())["trial_data"] if states else []
    except (json.JSONDecodeError, OSError):  # caught while Tune replaces the file
        return False
    status = {state["trial_id"]: state["status"] for state in (json.loads(t) for t, _ in trial_data)}
    return all(status.get(trial_id) == "TERMINATED" for trial_id in trial_ids)


# ---------------------------------------------------------------- one search, stopped twice, finished


@dataclass(frozen=True)
class ResumedSearch:
    """One search through the real CLI (`watched_tune.py`), stopped twice: killed with SIGKILL once a trial
    had finished and been saved; resumed with `--resume` and stopped by the driver itself after two
    full-budget drafts; resumed to the end. Both tests below read it: a search costs minutes."""

    root: Path  # the output_dir, with the MLflow store root/mlflow.db
    overrides: list[str]
    events: list[dict]  # what the driver did, in all three runs
    killed: dict[str, tuple[int, int]]  # finished_trials once killed
    interrupted: dict[str, int]  # finished_markers once the driver stopped
    resumed: subprocess.CompletedProcess
    outcome: TuneOutcome

    @property
    def out(self) -> Path:
        return self.root / "smoke" / "tune"

    def command(self, *flags: str) -> list[str]:
        return [SPECRAY, "tune", str(SMOKE), *self.overrides, *flags]


@pytest.fixture(scope="module")
def resumed_search(micro_zoo, tmp_path_factory) -> ResumedSearch:
    root = tmp_path_factory.mktemp("tune")
    # teacher.seed=3: no shards yet, so the driver must generate them — before the search, never during it
    # eval.replicas=2: the eval pool fills both CPUs, so the controls' samples, generated after the search
    # has evaluated, wait forever unless the pool is released for the teacher first
    extra = ("teacher.seed=3", "tune.max_concurrent_trials=2", "tune.replicates=2", "tune.controls=true")
    extra += ("eval.replicas=2",)
    overrides = micro_overrides(micro_zoo, root, *extra)
    log, pickled = root / "events.jsonl", root / "outcome.pkl"
    env = os.environ | {
        "TUNE_GLOBAL_CHECKPOINT_S": "1",  # Tune saves its state every second
        "WATCH_LOG": str(log),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    watched = [sys.executable, str(WATCHED), "tune", str(SMOKE), *overrides]

    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    process = subprocess.Popen(watched, cwd=root, env=env, start_new_session=True, **quiet)

    def one_trial_done_and_saved() -> bool:
        done = finished_trials(root)
        return bool(done) and saved_as_terminated(root, set(done))

    wait_until(lambda: process.poll() is not None or one_trial_done_and_saved(), "a finished, saved trial")
    assert process.poll() is None, "the search ended before it could be interrupted"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    killed = finished_trials(root)

    # the driver dies after two full-budget drafts
    stopped = subprocess.run(
        [*watched, "--resume"],
        cwd=root,
        env=env | {"WATCH_INTERRUPT_FINAL": "1"},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert stopped.returncode != 0 and "Interrupted" in stopped.stderr, stopped.stderr[-3000:]
    interrupted = finished_markers(root / "smoke" / "tune")

    resumed = subprocess.run(
        [*watched, "--resume"],
        cwd=root,
        env=env | {"WATCH_OUTCOME": str(pickled)},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    outcome = pickle.loads(pickled.read_bytes())
    return ResumedSearch(root, overrides, events, killed, interrupted, resumed, outcome)


def test_a_search_reads_cached_shards_logs_every_trial_and_registers_the_winner(
    resumed_search, tmp_path
) -> None:
    out, outcome = resumed_search.out, resumed_search.outcome
    before = resumed_search.interrupted
    under = {
        where: [f for f in before if Path(f).is_relative_to(out / where)] for where in ("final", "trials")
    }
    assert len(under["final"]) == 2 and under["trials"]  # where the driver stopped
    after = finished_markers(out)
    assert {folder: after[folder] for folder in before} == before  # nothing finished was trained again
    assert len(after) > len(before) and outcome.resumed

    generated = [e for e in resumed_search.events if e["event"] == "generate"]
    # in the driver, before the search (the resumed runs find them cached)
    assert generated[0]["taus"] == [0.0, 1.0]
    assert not any(e["searching"] for e in generated), "the teacher was asked for shards during the search"
    snapshots = [e["shards"] for e in resumed_search.events if e["event"].startswith("search_")]
    assert any(e["event"] == "search_end" for e in resumed_search.events)
    assert all(s == snapshots[0] for s in snapshots)  # no trial, killed or not, wrote (or rewrote) a shard
    assert len(outcome.trials) == 3 and {t.status for t in outcome.trials} <= {
        "completed",
        "stopped_early",
    }
    winner = outcome.winner
    assert winner.objective == max(t.objective for t in outcome.trials if t.objective is not None)

    uri = f"sqlite:///{resumed_search.root / 'mlflow.db'}"
    roles = runs_by_role(uri, "smoke")
    (parent,) = roles["tune"]
    assert parent.info.status == "FINISHED" and parent.data.tags["best_trial"] == winner.trial_id
    trials = roles["trial"]
    assert sorted(r.data.tags[TRIAL_ID] for r in trials) == sorted(t.trial_id for t in outcome.trials)
    client = MlflowClient(uri)
    points = []
    for run in trials:
        assert run.data.tags[PARENT] == parent.info.run_id
        assert {"w_tau_kd_0", "w_tau_kd_1", "mixture", "paradigm", "distill.steps"} <= set(run.data.params)
        points.append(len(client.get_metric_history(run.info.run_id, "acceptance_estimate")))
    # a trial killed after its last checkpoint resumes with its draft finished and reports only its result;
    # the trial that finished before the kill reported while it trained
    assert min(points) >= 1 and max(points) >= 2, points
    best = [r for r in trials if r.data.tags.get(BEST) == "true"]
    assert [r.data.tags[TRIAL_ID] for r in best] == [winner.trial_id]
    assert best[0].data.metrics["objective"] == pytest.approx(winner.objective)
    assert "speedup_model/in_domain/tau_dec_1" in best[0].data.metrics  # the search's own Table 3
    by_role: dict[str, list[str]] = {}
    for run in roles["draft"]:
        by_role.setdefault(run.data.tags["tune_role"], []).append(run.data.tags["draft"])
    # the search budget (tune.steps=2): its drafts are marked with it
    assert sorted(by_role["single"] + by_role["manual"]) == [
        "offline/mix=0:1,1:1@2",
        "offline/tau_kd=0@2",
        "offline/tau_kd=1@2",
    ]
    # the full budget (distill.steps=4): every single τ_kd, and each contender twice (tune.replicates=2)
    final = set(by_role["final"])
    assert {"offline/tau_kd=0", "offline/tau_kd=1", "offline/mix=0:1,1:1", "offline/mix=0:1,1:1/r1"} <= final
    single = outcome.table["single draft"].iloc[0]
    assert f"{single}/r1" in final and all(not name.endswith("@2") for name in final)
    # tune.controls: the manual recipe's control (2 samples at the best single τ_kd), both replicates
    tau_kd = outcome.table["single tau_kd"].iloc[0]
    assert {f"offline/tau_kd={tau_kd}/samples=1,1", f"offline/tau_kd={tau_kd}/samples=1,1/r1"} <= final
    controls = [e for e in resumed_search.events if e["event"] == "generate" and e["taus"] == [float(tau_kd)]]
    assert controls, "the control's second sample was not generated"

    name, version = outcome.registered
    registered = client.get_model_version(name, version)
    chosen = client.get_run(registered.run_id)  # of the winner's full-budget replicates
    assert chosen.data.tags["tune_role"] == "final" and chosen.data.tags["draft"].startswith("tuned:")
    assert registered.tags["steps"] == "4" and registered.tags["mixture"] == winner.recipe.mixture_tag
    model = client.get_logged_model(registered.source.removeprefix("models:/"))
    assert model.source_run_id == chosen.info.run_id and model.status == "READY"

    frame = outcome.table
    assert list(zip(frame.test_set, frame.tau_dec, strict=True)) == [
        ("in_domain", 1.0),
        ("out_of_domain", 1.0),
    ]
    assert frame["tuned gain"].notna().all() and set(frame["tuned replicates agree"]) <= {"0/2", "1/2", "2/2"}
    assert (frame["tuned gain low"] <= frame["tuned gain"]).all()
    report = outcome.report_dir
    for written in ("table3.md", "table3.csv", "table3_search.csv", "rank.csv", "report.md", "trials.csv"):
        assert (report / written).exists(), written
    assert "The search's own record" in outcome.markdown and "Spearman's ρ" in outcome.markdown
    rank = outcome.rank.recipes
    assert len(rank) >= 3 and {"offline/tau_kd=0", "offline/tau_kd=1"} <= set(rank.recipe)

    # the sweep report reads this folder (`specray report RUN --tune`): a composition verdict with an interval
    composition = load_composition(report.parent)
    verdicts = composition_gains(composition)
    assert len(verdicts) == 4  # manual and tuned, on both test sets
    assert all(np.isfinite([v.low, v.high]).all() and v.low <= v.effect <= v.high for v in verdicts)
    assert all(v.replicates == 2 and v.agreeing in ("0/2", "1/2", "2/2") for v in verdicts)  # training too
    assert composition.rank is not None and len(composition.rank) == len(rank)
    versus = control_gains(composition)  # each mixture against its samples at the best single τ_kd
    assert {v.scope.split(",")[0] for v in versus} >= {"manual recipe"} and len(versus) >= 2
    assert all(np.isfinite([v.low, v.high]).all() and v.replicates == 2 for v in versus)
    assert frame["manual vs control"].notna().all() and "manual vs control [95% CI]" in outcome.markdown

    # `specray export` of the tune run: its candidates are Table 3's full-budget drafts, every replicate
    candidates = {d["key"] for d in json.loads((report / TUNE_DRAFTS).read_text())["drafts"]}
    for source, register in ((str(report.parent), False), (parent.info.run_id, True)):
        to = tmp_path / f"export-{register}"
        exported = run_export(source, to, min_speedup=0.0, tracking_uri=uri, register_drafts=register)
        served = [b for b in exported.plan["bands"] if b["route"] == "speculative"]
        assert served and all(band["draft_key"] in candidates for band in served)
        assert (to / served[0]["draft"] / "config.json").is_file()
    assert exported.registered  # the MLflow source registers the served drafts

    # `specray export-data` of the tune run, from its folder and from its parent run id: the winner's
    # teacher data in the winner's proportions, in both trainers' formats
    from specray.serving.trainer_data import check_export, export_data
    from specray.serving.trainer_recipes import choose_recipes, read_run
    from tests.trainer_rules import specforge_problems, speculators_problems

    for source in (str(report.parent), parent.info.run_id):
        data = read_run(source, uri)
        (recipe,) = choose_recipes(data)  # a tune's default: its winner
        assert recipe.name.startswith("tuned:") and set(recipe.mixture) == set(winner.recipe.mixture)
        to = tmp_path / f"data-{len(source)}"
        entry = export_data(data, [recipe], to).manifest["recipes"][0]
        assert set(entry["rows_per_tau_kd"]) <= {f"{tau:g}" for tau in recipe.mixture}
        assert specforge_problems(to / entry["files"]["specforge"]["path"]) == []
        assert speculators_problems(to / entry["files"]["speculators"]["path"]) == []
        assert check_export(to) == []


def test_a_killed_search_resumes_without_rerunning_finished_trials(resumed_search) -> None:
    before, resumed = resumed_search.killed, resumed_search.resumed
    assert 1 <= len(before) < 3
    assert "(resumed)" in resumed.stdout and "| in_domain | 1 |" in resumed.stdout
    after = finished_trials(resumed_search.root)
    for trial_id, mtimes in before.items():  # neither retrained nor re-evaluated, by either resume
        assert after[trial_id] == mtimes, trial_id

    uri = f"sqlite:///{resumed_search.root / 'mlflow.db'}"
    roles = runs_by_role(uri, "smoke")
    assert len(roles["tune"]) == 1 and roles["tune"][0].info.status == "FINISHED"
    trial_ids = [r.data.tags[TRIAL_ID] for r in roles["trial"]]
    assert len(trial_ids) == len(set(trial_ids)) == 3  # num_samples in all, each once
    assert set(before) <= set(trial_ids)
    report = resumed_search.out / "report"
    rows = (report / "trials.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 3
    costs = json.loads((report / "step_costs.json").read_text())
    assert costs["draft"]["1"]["seconds"] > 0  # measured once (saved under its key: kept for --resume)

    again = subprocess.run(resumed_search.command(), cwd=resumed_search.root, capture_output=True, text=True)
    assert again.returncode == 2 and "already holds a search: add --resume" in again.stderr
    # --dry-run: the plan every driver starts with, against the disk; nothing run, nothing written
    state = sorted(p.name for p in resumed_search.out.rglob("*"))
    dry = subprocess.run(
        resumed_search.command("--dry-run"), cwd=resumed_search.root, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert (
        "search: 3 trials (optuna, space weights, early stopping asha), 2 at a time, 2 steps each"
        in dry.stdout
    )
    assert "each mixture's control, 2 replicate(s) each" in dry.stdout
    assert "teacher shards  2 reused, 0 to compute" in dry.stdout and "Started a local Ray" not in dry.stderr
    assert sorted(p.name for p in resumed_search.out.rglob("*")) == state


def test_cli_refuses_bad_tune_settings_before_starting_ray(micro_zoo, tmp_path) -> None:
    bad = micro_overrides(micro_zoo, tmp_path, "tune.objective_temperatures=[0.5]")
    result = subprocess.run([SPECRAY, "tune", str(SMOKE), *bad], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "tune.objective_temperatures: [0.5] not in eval.temperatures [0.0, 1.0]" in result.stderr
    assert "Started a local Ray instance" not in result.stderr
    dry = subprocess.run(
        [SPECRAY, "tune", str(SMOKE), *bad, "--dry-run"], cwd=tmp_path, capture_output=True, text=True
    )
    assert dry.returncode == 2 and "tune.objective_temperatures: [0.5] not in" in dry.stderr
