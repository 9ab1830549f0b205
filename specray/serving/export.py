"""Write a routing plan as what servers read: HF draft folders with metadata, `routing.json`, vLLM and
SGLang settings per band, and a README.

Layout of an export folder:
    routing.json                 bands -> (draft folder, γ, expected metrics), and per band a γ per band of
                                 request batch sizes; what `serving.router` reads
    drafts/<draft>/              each chosen draft: safetensors (hard-linked or copied), tokenizer, and a
                                 config.json with a `specray_config` block (below)
    vllm/<band>.json, <band>.sh  `--speculative-config` for vLLM's draft-model method (with its γ by batch
                                 size where the batch bands' γ differ), and the launch line
    sglang/<band>.json, <band>.sh  SGLang's STANDALONE arguments, and the launch line
    README.md                    the table of bands and how to serve each

The `specray_config` block follows the layout of the vLLM speculators project's `speculators_config`
(`algorithm`, `proposal_methods` with `speculative_tokens`, `default_proposal_method`, `verifier` with
`name_or_path` and `architectures`), plus the verifier's vocabulary size, the KD recipe, the sweep's keys
and one proposal method per temperature band with its recommended γ. It is not named `speculators_config`:
vLLM 0.33 reads a config.json holding that key as a speculators checkpoint (an EAGLE-style head whose
method comes from `speculators_model_type`), which a plain draft model is not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specray.draft import draft_folder_name
from specray.files import write_json, write_text
from specray.keys import spec_key
from specray.metrics import SPEEDUP
from specray.serving.engines import (
    SGLANG_VERSION,
    VLLM_VERSION,
    sglang_args,
    sglang_launch,
    vllm_launch,
    vllm_speculative_config,
)
from specray.serving.plan import BandPlan, BatchRoute, Route
from specray.serving.source import SweepResults, copy_draft, draft_recipe
from specray.serving.workload import workload_entry

ROUTING_FILE = "routing.json"
METADATA_KEY = "specray_config"
ROUTING_FORMAT = 2  # 2: `batch_sizes` per band (the band's own fields are those of the smallest B)


def target_info(results: SweepResults) -> dict[str, Any]:
    """The verifier: its name or path, architectures and vocabulary size (from its config)."""
    from transformers import AutoConfig

    from specray.models.sources import resolve_model_path

    spec = results.spec
    path = resolve_model_path(spec.models.target, spec.models)
    config = AutoConfig.from_pretrained(path, trust_remote_code=spec.models.target.trust_remote_code)
    return {
        "name_or_path": path,
        "architectures": list(config.architectures or []),
        "vocab_size": config.vocab_size,
    }


def band_entry(plan: BandPlan, folders: dict[str, str]) -> dict[str, Any]:
    """One band of routing.json: its route at the smallest batch size (what readers of format 1 read) and
    `batch_sizes`, its route per batch band."""
    return route_entry(plan.route, folders) | {"batch_sizes": [batch_entry(b, folders) for b in plan.batches]}


def batch_entry(batch: BatchRoute, folders: dict[str, str]) -> dict[str, Any]:
    """One batch band of a temperature band: [low, high) of request batch sizes, the B it was routed at,
    γ (0: no speculation), the draft, the speedup with its interval, and why."""
    route, choice = batch.route, batch.route.choice
    entry: dict[str, Any] = {
        "low": batch.batch.low,
        "high": batch.batch.high,
        "batch_size": batch.batch.batch_size,
        "route": "speculative" if choice else "none",
        "gamma": batch.gamma,
        "basis": route.basis,
        "reason": batch.reason,
    }
    if choice is None:
        entry |= {"draft": None}
        if route.best is not None:
            entry["best_candidate"] = _candidate(route.best)
        return entry
    candidate = _candidate(choice)
    return entry | {
        "draft": f"drafts/{folders[choice.draft_key]}",
        "draft_name": choice.draft,
        "draft_key": choice.draft_key,
        SPEEDUP: candidate[SPEEDUP],
        "cells": candidate["cells"],
    }


def route_entry(route: Route, folders: dict[str, str]) -> dict[str, Any]:
    """A band's route at one batch size, as format 1 wrote it."""
    band, choice = route.band, route.choice
    entry: dict[str, Any] = {
        "low": band.low,
        "high": band.high,
        "tau_decs": list(band.tau_decs),
        "alias": band.alias,
        "route": "speculative" if choice else "none",
        "basis": route.basis,
        "reason": route.reason,
    }
    if choice is None:
        entry |= {"draft": None, "gamma": None}
        if route.best is not None:
            entry["best_candidate"] = _candidate(route.best)
        return entry
    return entry | {"draft": f"drafts/{folders[choice.draft_key]}"} | _candidate(choice)


def _candidate(candidate) -> dict[str, Any]:
    speedup = asdict(candidate.speedup) | {"low": candidate.speedup.low}
    recipe = {"replicates": candidate.replicates, "recipe_speedup": candidate.recipe_speedup}
    return {
        "draft_name": candidate.draft,
        "draft_key": candidate.draft_key,
        "gamma": candidate.gamma,
        SPEEDUP: speedup,
        "expected": candidate.expected,
        "cells": candidate.cells,
        **(recipe if candidate.replicates > 1 else {}),
    }


def routing_plan(
    results: SweepResults, plans: Sequence[BandPlan], test_set: str, folders: dict[str, str]
) -> dict:
    """The whole of routing.json."""
    return {
        "format": ROUTING_FORMAT,
        "sweep": {
            "name": results.spec.name,
            "spec_key": spec_key(results.spec),
            "source": results.source,
            "test_set": test_set,
        },
        "target": target_info(results),
        "step_costs": results.cost.to_json(),
        "step_costs_summary": results.cost.describe(),
        "rule": {
            "bands": "[low, high); default: one band per measured τ_dec, edges at the midpoints",
            "choice": "highest speedup for the band (its smallest over the band's τ_dec); measured where the "
            "sweep timed every τ_dec of the band, modelled otherwise",
            "no_speculation": "no candidate's 95% speedup interval has its lower end above min_speedup",
            "replicates": "a recipe's training replicates compete as one candidate, ranked by their mean "
            "speedup; the draft served is the replicate whose own speedup is closest to that mean",
            "min_speedup": plans[0].route.min_speedup if plans else 1.0,
            "batch_sizes": "per band, [low, high) of request batch sizes: one per modelled B, from 1, "
            "open above (a batch of b rows: the largest B <= b); the band's own fields are those at the "
            "smallest B",
            "one_draft": "a deployment loads one draft: the band's, chosen at the smallest B; a larger B "
            "takes that draft's best γ, 0 (no speculation) when none clears min_speedup",
        },
        "engines": {"vllm": VLLM_VERSION, "sglang": SGLANG_VERSION},
        "bands": [band_entry(plan, folders) for plan in plans],
    }


def draft_metadata(results: SweepResults, plan: dict, draft_key: str) -> dict[str, Any]:
    """The `specray_config` block of one exported draft's config.json."""
    bands = [b for b in plan["bands"] if b.get("draft_key") == draft_key and b["route"] == "speculative"]
    methods = [
        {
            "proposal_type": "speculative_sampling",
            "speculative_tokens": b["gamma"],
            "speculative_tokens_per_batch_size": [
                {"low": e["low"], "high": e["high"], "gamma": e["gamma"]} for e in b["batch_sizes"]
            ],
            "temperature_band": {"low": b["low"], "high": b["high"], "alias": b["alias"]},
            "expected": {SPEEDUP: b[SPEEDUP], **b["expected"]},
        }
        for b in bands
    ]
    target = plan["target"]
    return {
        "algorithm": "draft_model",
        "proposal_methods": methods,
        "default_proposal_method": "speculative_sampling",
        "verifier": target,
        "kd_recipe": draft_recipe(results.draft_dirs[draft_key])
        or {"paradigm": None, "note": "un-distilled"},
        "sweep": plan["sweep"] | {"draft_key": draft_key, "draft_name": bands[0]["draft_name"]},
    }


def write_draft(results: SweepResults, plan: dict, draft_key: str, folder: Path) -> None:
    """The draft's HF files, its config.json carrying the metadata block."""
    copy_draft(results.draft_dirs[draft_key], folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config[METADATA_KEY] = draft_metadata(results, plan, draft_key)
    write_text(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_engines(plan: dict, to: Path) -> None:
    """vllm/ and sglang/: per band the settings file (speculative bands) and the launch line."""
    target = plan["target"]["name_or_path"]
    for band in plan["bands"]:
        name = band["alias"]
        if band["route"] == "speculative":
            draft = str((to / band["draft"]).resolve())
            per_batch = [(e["low"], e["high"], e["gamma"]) for e in band["batch_sizes"]]
            config = vllm_speculative_config(draft, band["gamma"], per_batch)
            args = sglang_args(draft, band["gamma"])  # one γ for every batch size (engines.py)
            write_json(to / "vllm" / f"{name}.json", config)
            write_json(to / "sglang" / f"{name}.json", args)
        else:
            config, args = None, None
        header = f"# request temperatures in {_label(band)}: {band['reason']}\n"
        write_text(to / "vllm" / f"{name}.sh", header + vllm_launch(target, config) + "\n")
        write_text(to / "sglang" / f"{name}.sh", header + sglang_launch(target, args) + "\n")


def _label(band: dict) -> str:
    return f"[{band['low']:g}, {'∞' if band['high'] is None else format(band['high'], 'g')})"


def export_plan(results: SweepResults, plans: Sequence[BandPlan], to: Path, test_set: str) -> dict:
    """Write the export folder; returns routing.json's content."""
    from specray.serving.readme import export_readme

    chosen = {
        b.route.choice.draft_key: b.route.choice.draft
        for p in plans
        for b in p.batches
        if b.route.choice is not None
    }
    folders = {key: draft_folder_name(name) for key, name in chosen.items()}
    plan = routing_plan(results, plans, test_set, folders)
    workload = workload_entry(results.spec, results.cells, plans)
    plan |= {"workload": workload} if workload is not None else {}
    for key, folder in folders.items():
        write_draft(results, plan, key, to / "drafts" / folder)
    write_engines(plan, to)
    write_json(to / ROUTING_FILE, plan, indent=2)
    write_text(to / "README.md", export_readme(plan))
    return plan
