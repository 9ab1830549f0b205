"""`specray export`: read a finished sweep or tune run, plan the routes, write the export folder, register the
drafts in MLflow, and optionally check the plan with HF assisted generation."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from specray.errors import SpecError
from specray.serving.bands import parse_edges
from specray.serving.export import ROUTING_FILE, export_plan
from specray.serving.plan import BandPlan, Route, plan_batched
from specray.serving.source import SweepResults
from specray.serving.tune_source import read_source
from specray.serving.verify import BandCheck


@dataclass
class ExportOutcome:
    folder: Path
    results: SweepResults
    plan: dict
    routes: list[Route]  # each band's at the smallest batch size
    registered: dict[str, str] = field(default_factory=dict)  # draft folder -> model version
    model_name: str = ""
    export_run_id: str | None = None
    checks: list[BandCheck] = field(default_factory=list)
    plans: list[BandPlan] = field(default_factory=list)  # each band's routes per batch band


def prepare_folder(folder: Path) -> None:
    """An empty folder, or an earlier export (its generated parts are removed, so nothing stale stays)."""
    if folder.exists() and any(folder.iterdir()):
        if not (folder / ROUTING_FILE).is_file():
            raise SpecError(f"--to {folder}: not empty and not an earlier export; choose an empty folder")
        for part in ("drafts", "vllm", "sglang"):
            shutil.rmtree(folder / part, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)


def register(results: SweepResults, outcome: ExportOutcome, tracking_uri: str) -> None:
    """One registry version per chosen draft, an alias per band (removed for a no-speculation band), and the
    export folder (routing.json with it) as the artifact of an export run under the sweep's parent run."""
    from specray.keys import spec_key
    from specray.tracking.client import open_tracker

    spec = results.spec
    tracker = open_tracker(tracking_uri, spec.experiment)
    key = spec_key(spec)
    parent = results.parent_run_id or tracker.sweep_run(key)
    run_id = tracker.export_run(key, f"{spec.name}-export-{key[:6]}", parent, outcome.folder)
    name = f"{spec.name}-serving-draft"
    versions: dict[str, str] = {}
    aliases: dict[str, str | None] = {}
    for band in outcome.plan["bands"]:
        if band["route"] == "speculative" and band["draft"] not in versions:
            tags = {"draft": band["draft_name"], "draft_key": band["draft_key"], "spec_key": key}
            versions[band["draft"]] = tracker.register_version(name, run_id, f"export/{band['draft']}", tags)
        aliases[band["alias"]] = versions.get(band["draft"]) if band["route"] == "speculative" else None
    if versions:
        tracker.set_aliases(name, aliases)
    outcome.registered, outcome.model_name, outcome.export_run_id = versions, name, run_id


def run_export(
    source: str,
    to: Path,
    bands: str | None = None,
    test_set: str = "in_domain",
    min_speedup: float = 1.0,
    tracking_uri: str | None = None,
    register_drafts: bool = True,
) -> ExportOutcome:
    """Plan and write the export of a finished sweep or tune run (folder or MLflow parent run id)."""
    prepare_folder(to)
    results = read_source(source, tracking_uri, to / ".source")
    if test_set not in results.spec.eval.test_sets:
        raise SpecError(f"--test-set {test_set!r}: the sweep evaluated {results.spec.eval.test_sets}")
    edges = parse_edges(bands) if bands else None
    plans = plan_batched(results.cells, test_set, edges, min_speedup)
    plan = export_plan(results, plans, to, test_set)
    outcome = ExportOutcome(to, results, plan, [p.route for p in plans], plans=plans)
    shutil.rmtree(to / ".source", ignore_errors=True)  # downloaded records and drafts, now copied
    if register_drafts:
        register(results, outcome, tracking_uri or results.spec.tracking.uri)
    return outcome


def verify_outcome(outcome: ExportOutcome, prompts_limit: int, seed: int = 0) -> list[BandCheck]:
    """`--verify`: HF assisted generation and specray's decoder on the held-out test prompts, per speculative
    band and per declined band's best candidate."""
    from specray.models.loading import load_tokenizer
    from specray.serving.verify import verify_export
    from specray.sweep.plan import plan_sweep
    from specray.sweep.stages import encode

    spec, test_set = outcome.results.spec, outcome.plan["sweep"]["test_set"]
    tokenizer = load_tokenizer(outcome.plan["target"]["name_or_path"])
    plan = plan_sweep(spec)
    target = outcome.plan["target"]["name_or_path"]
    prompts = encode(plan, plan.prompt_sets[test_set], tokenizer, target)[:prompts_limit]
    settings = {
        "max_new_tokens": spec.eval.max_new_tokens,
        "eos": tokenizer.eos_token_id,
        "pad": tokenizer.pad_token_id,
        "seed": seed,
    }
    # a declined band's best candidate is measured from the sweep's own draft folder (it is not exported)
    candidates = {draft.name: draft.folder for draft in plan.evaluated if draft.folder.is_dir()}
    outcome.checks = verify_export(outcome.folder, prompts, settings, spec.models.target.dtype, candidates)
    return outcome.checks
