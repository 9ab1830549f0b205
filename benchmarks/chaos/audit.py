"""What must hold after a chaos run: its finished tree against a fault-free run's of the same spec and seeds.

`audit(reference, chaos)` returns every problem found (empty: the chaos run is the fault-free run):
- the same shard, draft and cell keys (and target continuations);
- every shard's rows equal, each prompt exactly once; every draft's weights bit-identical (SHA-256 of its
  safetensors as its `finished.json` records them, checked against the files), its curves equal;
- every cell's figures equal, wall-time figures excepted (TIMING: `seconds` and every figure named with it,
  the measured `speedup` and its interval, the curves' `tokens_per_s` and `seconds_per_step`);
- nothing else in the tree: no temp file, no part file, no Ray Train work folder, no draft set aside as
  damaged, no cell record the plan does not have (lock files are the only hidden files kept, by design:
  `specray/locks.py`);
- MLflow: one parent run, FINISHED; one child run per draft, FINISHED, and no other run; every cell metric
  logged once and every curve metric once per step, with the reference's values; one READY logged model
  per distilled draft, and no artifacts of any other logged model left in the store;
- the report: `report.md` equal with the figures of its wall-time section masked, `cells.csv` equal without
  its timing columns, every figure but the measured-speedup heatmaps byte-identical.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

TIMING = {"seconds", "speedup", "speedup_ci95", "tokens_per_s", "seconds_per_step"}
TIMING_FIGURES = ("heatmap_speedup_measured_or_modelled_",)  # measured wall-time speedups are drawn there
TIMING_SECTION = "## Speedup model vs measured wall time"
OUTPUT_ENTRIES = {".specray.lock", "spec.yaml", "drafts", "cells", "report", "step_costs"}
# MLflow tags specray sets (specray/tracking/names.py), spelled out: the audit reads a store as a user would
ROLE, PARENT = "specray.role", "mlflow.parentRunId"
NUMBER = re.compile(r"[-+]?\d+\.\d+|[-+]?\d+")


def is_timing(name: str) -> bool:
    """A field or metric that holds a wall time (or a figure computed from one)."""
    parts = name.split("/")
    return parts[0] in TIMING or "seconds" in parts[0] or name.startswith(("stage_seconds", "step_ms"))


@dataclass(frozen=True)
class Tree:
    """A finished run: `root` holds its output folder (out/<name>), its cache and its MLflow store."""

    root: Path
    name: str = "smoke"

    @property
    def out(self) -> Path:
        return self.root / "out" / self.name

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"


def audit(reference: Tree, chaos: Tree) -> list[str]:
    problems: list[str] = []
    for check in (_shards, _continuations, _drafts, _cells, _outputs, _report, _tracking):
        problems += check(reference, chaos)
    return problems


def _hidden_ok(folder: Path, names: set[str]) -> list[str]:
    """Hidden entries of `folder` other than the lock files of `names`' entries."""
    allowed = {f".{name}.lock" for name in names}
    return [f"{folder / p.name}: left behind" for p in folder.glob(".*") if p.name not in allowed]


def _visible(folder: Path) -> dict[str, Path]:
    return (
        {p.name: p for p in sorted(folder.iterdir()) if not p.name.startswith(".")} if folder.is_dir() else {}
    )


def _keys(what: str, reference: set[str], chaos: set[str]) -> list[str]:
    if reference == chaos:
        return []
    return [f"{what}: missing {sorted(reference - chaos)}, extra {sorted(chaos - reference)}"]


def _shards(reference: Tree, chaos: Tree) -> list[str]:
    from specray.data.shards import MANIFEST_FILE, SHARD_FILE, read_shard

    ref, got = _visible(reference.cache / "shards"), _visible(chaos.cache / "shards")
    problems = _keys("shard keys", set(ref), set(got)) + _hidden_ok(chaos.cache / "shards", set(got))
    for key in sorted(set(ref) & set(got)):
        entries = sorted(p.name for p in got[key].iterdir())
        if entries != sorted([MANIFEST_FILE, SHARD_FILE]):
            problems.append(f"shard {key}: holds {entries}, not just the shard and its manifest")
        table, expected = read_shard(got[key]), read_shard(ref[key])
        ids = table.column("prompt_id").to_pylist()
        if len(ids) != len(set(ids)) or sorted(ids) != sorted(expected.column("prompt_id").to_pylist()):
            problems.append(f"shard {key}: {len(ids)} rows, {len(set(ids))} prompts; not each prompt once")
        elif not table.equals(expected):
            differ = sum(a != b for a, b in zip(table.to_pylist(), expected.to_pylist(), strict=True))
            problems.append(f"shard {key}: {differ} of {len(ids)} rows differ from the reference's")
    return problems


def _continuations(reference: Tree, chaos: Tree) -> list[str]:
    ref, got = _visible(reference.cache / "continuations"), _visible(chaos.cache / "continuations")
    problems = _keys("target continuations", set(ref), set(got))
    problems += _hidden_ok(chaos.cache / "continuations", set(got))
    for name in sorted(set(ref) & set(got)):
        if json.loads(ref[name].read_text()) != json.loads(got[name].read_text()):
            problems.append(f"target continuations {name}: differ from the reference's")
    return problems


def _drafts(reference: Tree, chaos: Tree) -> list[str]:
    from specray.distill.checkpoints import FINISHED_FILE, damaged_weights, read_finished

    ref, got = _visible(reference.out / "drafts"), _visible(chaos.out / "drafts")
    problems = _keys("draft folders", set(ref), set(got)) + _hidden_ok(chaos.out / "drafts", set())
    for name in sorted(set(ref) & set(got)):
        if not (got[name] / FINISHED_FILE).is_file():
            problems.append(f"draft {name}: no {FINISHED_FILE}")
            continue
        mine, theirs = read_finished(got[name]), read_finished(ref[name])
        if mine.fingerprint != theirs.fingerprint:
            problems.append(f"draft {name}: key {mine.fingerprint}, the reference's {theirs.fingerprint}")
        if damaged_weights(got[name]):
            problems.append(f"draft {name}: weights differ from its own {FINISHED_FILE}")
        if mine.weights_sha256 != theirs.weights_sha256:
            problems.append(
                f"draft {name}: weights differ from the reference's (resumed from {mine.resumed_from})"
            )
        curves = [_untimed(point) for point in json.loads((got[name] / "curves.json").read_text())]
        if curves != [_untimed(point) for point in json.loads((ref[name] / "curves.json").read_text())]:
            problems.append(f"draft {name}: curves differ from the reference's")
    return problems


def _untimed(payload: dict) -> dict:
    return {k: v for k, v in payload.items() if not is_timing(k)}


def _cells(reference: Tree, chaos: Tree) -> list[str]:
    ref, got = _visible(reference.out / "cells"), _visible(chaos.out / "cells")
    problems = _keys("cell keys", set(ref), set(got)) + _hidden_ok(chaos.out / "cells", set())
    for name in sorted(set(ref) & set(got)):
        mine, theirs = json.loads(got[name].read_text()), json.loads(ref[name].read_text())
        mine["metrics"], theirs["metrics"] = _untimed(mine["metrics"]), _untimed(theirs["metrics"])
        if _untimed(mine) != _untimed(theirs):
            fields = sorted(k for k in mine["metrics"] if mine["metrics"][k] != theirs["metrics"].get(k))
            problems.append(f"cell {name} ({mine['draft']}): differs from the reference's ({fields[:5]})")
    return problems


def _outputs(reference: Tree, chaos: Tree) -> list[str]:
    extra = {p.name for p in chaos.out.iterdir()} - OUTPUT_ENTRIES
    return [f"{chaos.out / name}: not part of a finished sweep" for name in sorted(extra)]


def _report(reference: Tree, chaos: Tree) -> list[str]:
    ref, got = reference.out / "report", chaos.out / "report"
    problems = _keys("report files", set(_visible(ref)), set(_visible(got)))
    if _masked(got / "report.md") != _masked(ref / "report.md"):
        problems.append("report.md: differs from the reference's (wall-time section masked)")
    if _csv(got / "cells.csv") != _csv(ref / "cells.csv"):
        problems.append("report/cells.csv: differs from the reference's (timing columns left out)")
    for figure in sorted(set(p.name for p in ref.glob("*.png")) & set(p.name for p in got.glob("*.png"))):
        if (
            not figure.startswith(TIMING_FIGURES)
            and (ref / figure).read_bytes() != (got / figure).read_bytes()
        ):
            problems.append(f"report/{figure}: differs from the reference's")
    return problems


def _masked(path: Path) -> list[str]:
    """The report's lines, the figures of its wall-time section replaced by `#` and that section's list of
    cells the model misses and its blank lines left out (which cells miss depends on the wall times)."""
    lines, timing = [], False
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            timing = line.startswith(TIMING_SECTION)
        if timing and (line.startswith("- neither: ") or not line.strip()):
            continue
        lines.append(NUMBER.sub("#", line) if timing else line)
    return lines


def _csv(path: Path) -> list[list[tuple[str, str]]]:
    """The header and rows, in order, without the timing columns."""
    rows = list(csv.reader(io.StringIO(path.read_text())))
    keep = [i for i, name in enumerate(rows[0]) if not is_timing(name)]
    return [[(rows[0][i], row[i]) for i in keep] for row in rows]


def _tracking(reference: Tree, chaos: Tree) -> list[str]:
    from mlflow.tracking import MlflowClient

    problems: list[str] = []
    runs = {}
    for tree in (reference, chaos):
        client = MlflowClient(tree.uri)
        experiment = client.get_experiment_by_name(tree.name)
        runs[tree.root] = (client, experiment.experiment_id, client.search_runs([experiment.experiment_id]))
    ref_client, _, ref_runs = runs[reference.root]
    client, experiment_id, all_runs = runs[chaos.root]
    parents = [r for r in all_runs if r.data.tags.get(ROLE) == "sweep"]
    if len(parents) != 1 or parents[0].info.status != "FINISHED":
        return [f"MLflow: {len(parents)} parent runs ({[p.info.status for p in parents]}), not one FINISHED"]
    children = {r.data.tags.get("draft"): r for r in all_runs if r is not parents[0]}
    ref_children = {r.data.tags.get("draft"): r for r in ref_runs if r.data.tags.get(ROLE) != "sweep"}
    if len(children) != len(all_runs) - 1:
        problems.append(f"MLflow: {len(all_runs) - 1} runs beside the parent for {len(children)} drafts")
    problems += _keys("MLflow child runs", set(ref_children), set(children))
    problems += _logged_once(client, parents[0], "the parent run")
    for name in sorted(set(ref_children) & set(children)):
        problems += _child(client, children[name], ref_children[name], name)
    problems += _logged_models(client, experiment_id, chaos, children)
    return problems


def _child(client, run, reference, name: str) -> list[str]:  # noqa: ANN001 (MLflow's types)
    problems = []
    if run.info.status != "FINISHED" or run.data.tags.get(PARENT) is None:
        problems.append(f"MLflow run of {name}: {run.info.status}")
    if run.data.metrics.keys() != reference.data.metrics.keys():
        problems.append(f"MLflow run of {name}: other metrics than the reference's")
    for key in sorted(run.data.metrics):
        history = client.get_metric_history(run.info.run_id, key)
        steps = [point.step for point in history]
        if len(steps) != len(set(steps)):
            problems.append(
                f"MLflow run of {name}: {key} logged {len(steps)} times at {len(set(steps))} steps"
            )
        if not is_timing(key) and run.data.metrics[key] != reference.data.metrics.get(key):
            problems.append(
                f"MLflow run of {name}: {key} = {run.data.metrics[key]}, "
                f"reference {reference.data.metrics.get(key)}"
            )
    names = [i.dataset.name for i in run.inputs.dataset_inputs]
    if len(names) != len(set(names)):
        problems.append(f"MLflow run of {name}: datasets {names} logged more than once")
    return problems


def _logged_once(client, run, label: str) -> list[str]:  # noqa: ANN001 (MLflow's types)
    """Every metric of `run` logged once per step (a cell metric, at step 0, once)."""
    problems = []
    for key in sorted(run.data.metrics):
        steps = [point.step for point in client.get_metric_history(run.info.run_id, key)]
        if len(steps) != len(set(steps)):
            problems.append(f"{label}: {key} logged {len(steps)} times at {len(set(steps))} steps")
    return problems


def _logged_models(client, experiment_id: str, chaos: Tree, children: dict) -> list[str]:  # noqa: ANN001
    problems = []
    models = client.search_logged_models([experiment_id])
    ready = [m for m in models if str(m.status).endswith("READY")]
    by_run: dict[str, int] = {}
    for model in ready:
        by_run[model.source_run_id] = by_run.get(model.source_run_id, 0) + 1
    for name, run in children.items():
        expected = 0 if name == "non-distill" else 1
        if by_run.get(run.info.run_id, 0) != expected:
            problems.append(
                f"MLflow: {by_run.get(run.info.run_id, 0)} READY logged models of {name}, not {expected}"
            )
    if len(models) != len(ready):
        problems.append(f"MLflow: {len(models) - len(ready)} logged models not READY")
    stored = {p.name for p in (chaos.root / "mlruns" / experiment_id / "models").glob("m-*")}
    orphans = stored - {m.model_id for m in ready}
    if orphans:
        problems.append(
            f"MLflow artifact store: files of {len(orphans)} logged models that are not READY: "
            f"{sorted(orphans)}"
        )
    return problems
