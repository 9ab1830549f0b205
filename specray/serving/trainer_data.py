"""A finished run's teacher data in the formats the EAGLE-3 trainers read: SpecForge and speculators.

Neither trainer's loss has a teacher temperature: τ_kd reaches a draft trained there only through the text
the target regenerated. specray's shards are that text, per τ_kd; a recipe (a mixture, e.g. a tune's
winner) is a file whose rows come from its τ_kd in its proportions: for each train prompt, one response,
from a τ_kd drawn by the recipe's weights (seeded by the recipe, so the same command writes the same file).

    <to>/specforge/<recipe>.jsonl     {"id", "conversations": [user, assistant], "status", "metadata"}
                                      — SpecForge's data format (docs/basic_usage/data_preparation.md) and
                                      its regenerated rows (scripts/regenerate_train_data.py), read at
                                      sgl-project/SpecForge 0.2.0
    <to>/speculators/<recipe>.jsonl   {"id", "primary_id", "input_ids", "loss_mask", "text", "conversations",
                                      "metadata": {..., "sampling_params"}} — the rows speculators'
                                      scripts/response_regeneration writes (loss_mask 1 on generated tokens),
                                      read at vllm-project/speculators v0.7.0.1
    <to>/manifest.json                source run, recipes, rows per τ_kd, each shard's key and sha256, each
                                      file's rows and sha256 (`check_export` re-reads them)
    <to>/README.md                    the commands that train an EAGLE-3 draft on each file

Every row says the τ_kd it was sampled at, the sampling parameters (specray's teacher samples the full
distribution: top-p 1, top-k off) and the teacher. A response that is blank text is left out (SpecForge's
validation refuses empty content; speculators drops rows with nothing to learn) and counted in the manifest.
The run read and the recipes chosen are `trainer_recipes.py`'s.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specray.config import SweepSpec
from specray.data.examples import Example
from specray.errors import DataError, SpecError
from specray.files import file_sha256, write_json, write_text
from specray.serving.trainer_recipes import Recipe, RunData

EXPORT_FORMAT = 1
FORMATS = ("specforge", "speculators")
MANIFEST = "manifest.json"
TOP_P, TOP_K = 1.0, -1  # the teacher's sampling: the whole distribution (vLLM's top_k -1: off)


def user_turn(example: Example) -> str:
    """The user's message of a one-turn example (a conversation given whole: its first turn)."""
    return f"{example.instruction}\n\n{example.input}" if example.input.strip() else example.instruction


@dataclass
class Written:
    folder: Path
    manifest: dict[str, Any]


def export_data(
    run: RunData, recipes: Sequence[Recipe], to: Path, formats: Sequence[str] = FORMATS
) -> Written:
    """Write every recipe in every format, then the manifest and the README."""
    from specray.data.shards import read_manifest, read_shard, shard_dir
    from specray.sweep.plan import plan_sweep

    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise SpecError(f"--format {bad[0]!r}: choose from {', '.join(FORMATS)}")
    plan = run.plan or plan_sweep(run.spec)
    keys = plan.shards[0].keys  # replicate 0's teacher sample (teacher.replicate_shards: one per replicate)
    examples = {e.id: e for e in plan.shards[0].examples}
    needed = sorted({tau for recipe in recipes for tau in recipe.mixture})
    missing = [tau for tau in needed if read_manifest(shard_dir(keys[tau])) is None]
    if missing:
        raise DataError(
            f"the τ_kd={missing[0]:g} shard ({shard_dir(keys[missing[0]])}) is not in this machine's cache: "
            f"run `specray generate` on the run's spec (its spec.yaml) here, or export where the run ran"
        )
    tables = {tau: read_shard(keys[tau]).to_pylist() for tau in needed}  # checked against their manifests
    shards = {}
    for tau in needed:
        found = read_manifest(shard_dir(keys[tau])) or {}
        shards[f"{tau:g}"] = {
            "key": keys[tau].digest,
            "rows": len(tables[tau]),
            "sha256": found.get("sha256"),
        }
    to.mkdir(parents=True, exist_ok=True)
    entries = []
    for recipe in recipes:
        rows, skipped = recipe_rows(recipe, tables, run.spec.teacher.seed)
        files = {}
        for fmt in formats:
            path = to / fmt / f"{recipe.file_stem}.jsonl"
            lines = [
                json.dumps(_row(fmt, row, examples, run.spec, i), ensure_ascii=False)
                for i, row in enumerate(rows)
            ]
            write_text(path, "".join(line + "\n" for line in lines))
            files[fmt] = {"path": str(path.relative_to(to)), "rows": len(lines), "sha256": file_sha256(path)}
        counts: dict[str, int] = {}
        for row in rows:
            counts[f"{row['tau']:g}"] = counts.get(f"{row['tau']:g}", 0) + 1
        entries.append(
            {
                "name": recipe.name,
                "mixture": {f"{t:g}": w for t, w in sorted(recipe.mixture.items())},
                "rows_per_tau_kd": counts,
                "skipped_blank_responses": skipped,
                "files": files,
            }
        )
    manifest = {
        "format": EXPORT_FORMAT,
        "source": run.source,
        "kind": run.kind,
        "sweep": run.spec.name,
        "teacher": {
            "model": str(keys[needed[0]].teacher),
            "engine": run.spec.teacher.engine,
            "dtype": run.spec.models.target.dtype,
            "seed": run.spec.teacher.seed,
            "max_new_tokens": run.spec.teacher.max_new_tokens,
            "top_p": TOP_P,
            "top_k": TOP_K,
        },
        "shards": shards,
        "recipes": entries,
    }
    write_json(to / MANIFEST, manifest)
    write_text(to / "README.md", _readme(run, manifest))
    return Written(to, manifest)


def recipe_rows(
    recipe: Recipe, tables: Mapping[float, list[dict[str, Any]]], seed: int
) -> tuple[list[dict[str, Any]], int]:
    """One row per train prompt: from the recipe's single τ_kd, or from a τ_kd drawn by its weights
    (random.Random seeded by the recipe and the teacher seed); blank responses left out (and counted)."""
    taus = sorted(recipe.mixture)
    by_prompt = {tau: {row["prompt_id"]: row for row in tables[tau]} for tau in taus}
    order = [row["prompt_id"] for row in tables[taus[0]]]
    draw = random.Random(f"{seed}|export-data|{recipe.name}")
    weights = [recipe.mixture[tau] for tau in taus]
    rows, skipped = [], 0
    for prompt_id in order:
        tau = taus[0] if len(taus) == 1 else draw.choices(taus, weights)[0]
        row = by_prompt[tau].get(prompt_id)
        if row is None:
            continue
        if not row["response"].strip():
            skipped += 1
            continue
        rows.append(row)
    return rows, skipped


def sampling_params(row: Mapping[str, Any], spec: SweepSpec) -> dict[str, Any]:
    """The sampling a row was drawn with, in vLLM's names (what speculators records per row)."""
    tokens = spec.teacher.max_new_tokens
    return {
        "temperature": row["tau"],
        "top_p": TOP_P,
        "top_k": TOP_K,
        "max_tokens": tokens,
        "seed": row["seed"],
    }


def _row(
    fmt: str, row: Mapping[str, Any], examples: Mapping[str, Example], spec: SweepSpec, index: int
) -> dict:
    example = examples.get(row["prompt_id"])
    if example is None:
        raise DataError(f"shard row {row['prompt_id']}: not a prompt of the run's train split")
    conversation = [
        {"role": "user", "content": user_turn(example)},
        {"role": "assistant", "content": row["response"]},
    ]
    metadata = {
        "tau_kd": row["tau"],
        "sampling_params": sampling_params(row, spec),
        "teacher": row["teacher"],
        "finish_reason": row["finish_reason"],
    }
    if fmt == "specforge":
        return {
            "id": row["prompt_id"],
            "conversations": conversation,
            "status": "success",
            "metadata": metadata,
        }
    prompt, response = list(row["prompt_token_ids"]), list(row["response_token_ids"])
    return {
        "id": f"{row['prompt_id']}_gen0",
        "primary_id": row["prompt_id"],
        "input_ids": prompt + response,
        "loss_mask": [0] * len(prompt) + [1] * len(response),
        "text": row["prompt"] + row["response"],
        "conversations": conversation,
        "metadata": {
            "idx": index,
            "is_tool_call": False,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(response)},
            "endpoint": f"specray teacher ({spec.teacher.engine})",
            **metadata,
        },
    }


def check_export(folder: Path) -> list[str]:
    """What differs between an export's manifest and its files (rows, sha256, rows per τ_kd) and the shards
    it names where this machine's cache holds them; [] when everything matches."""
    from specray.data.shards import read_manifest, shards_root

    manifest = json.loads((folder / MANIFEST).read_text())
    problems = []
    for recipe in manifest["recipes"]:
        for entry in recipe["files"].values():
            path = folder / entry["path"]
            if not path.is_file():
                problems.append(f"{entry['path']}: missing")
                continue
            if file_sha256(path) != entry["sha256"]:
                problems.append(f"{entry['path']}: sha256 differs from {MANIFEST}")
            rows = [json.loads(line) for line in path.read_text().splitlines() if line]
            if len(rows) != entry["rows"]:
                problems.append(f"{entry['path']}: {len(rows)} rows, {MANIFEST} says {entry['rows']}")
            counts: dict[str, int] = {}
            for row in rows:
                tau = f"{row['metadata']['tau_kd']:g}"
                counts[tau] = counts.get(tau, 0) + 1
            if counts != recipe["rows_per_tau_kd"]:
                problems.append(
                    f"{entry['path']}: rows per τ_kd {counts}, {MANIFEST} says {recipe['rows_per_tau_kd']}"
                )
    for tau, shard in manifest["shards"].items():
        found = read_manifest(shards_root() / shard["key"])
        if found is not None and (found["sha256"], found["rows"]) != (shard["sha256"], shard["rows"]):
            problems.append(f"τ_kd={tau} shard {shard['key']}: not the shard the export was written from")
    return problems


def _readme(run: RunData, manifest: Mapping[str, Any]) -> str:
    target = run.spec.models.target
    # a trainer loads the target by its hub name or folder; a GGUF file or a zoo model is named for the reader
    model = target.name_or_path or "TARGET"
    which = "" if target.name_or_path else f" (this run's target: {target.gguf or f'the zoo {target.zoo}'})"
    lines = [
        f"# Teacher data of `{run.spec.name}` for EAGLE-3 trainers",
        "",
        f"Written by `specray export-data` from {run.kind} `{run.source}`; the target that sampled it: "
        f"`{target.name_or_path or target.gguf or target.zoo}` ({manifest['teacher']['engine']}, "
        f"{manifest['teacher']['dtype']}). `manifest.json` has "
        "the rows per τ_kd, the shards and the sha256 of every file.",
        "",
        "| recipe | τ_kd mixture | rows per τ_kd | SpecForge file | speculators file |",
        "|---|---|---|---|---|",
    ]
    for r in manifest["recipes"]:
        mix = ", ".join(f"{t}: {w:.3g}" for t, w in r["mixture"].items())
        counts = ", ".join(f"{t}: {n}" for t, n in r["rows_per_tau_kd"].items())
        files = [r["files"].get(f, {}).get("path", "-") for f in FORMATS]
        lines.append(f"| {r['name']} | {mix} | {counts} | `{files[0]}` | `{files[1]}` |")
    first = manifest["recipes"][0]["files"]
    specforge = first.get("specforge", {}).get("path", "specforge/FILE.jsonl")
    speculators = first.get("speculators", {}).get("path", "speculators/FILE.jsonl")
    lines += [
        "",
        "## SpecForge (0.2.0)",
        "",
        "Point the training config's data at a file and name your target's chat template:",
        "",
        "```bash",
        f"specforge train --config your-eagle3-config.yaml data.train_data_path={specforge} \\",
        f"    model.target_model_path={model} data.chat_template=YOUR_TEMPLATE",
        "```",
        "",
        "## speculators (0.7)",
        "",
        "The rows carry token ids and loss masks: `prepare_data.py` passes them through as they are.",
        "",
        "```bash",
        f"python scripts/prepare_data.py --model {model} --data {speculators} --output ./prepared",
        f"python scripts/train.py --verifier-name-or-path {model} --data-path ./prepared \\",
        "    --vllm-endpoint http://localhost:8000/v1 --save-path ./checkpoints",
        "```",
        "",
        f"`TARGET`{which}: the hub name or folder of the target that sampled the data. The token ids are "
        "that target's tokenizer's: train against the same target.",
    ]
    return "\n".join(lines) + "\n"
