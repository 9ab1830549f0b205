"""The README of an export folder: the table of bands and how to serve each."""

from __future__ import annotations

import math
from typing import Any

from specray.metrics import (
    ACCEPTANCE_RATE,
    ACCEPTANCE_RATE_CI95,
    DRAFT_ACCEPTANCE,
    DRAFT_ACCEPTANCE_CI95,
    MEAN_ACCEPTANCE_LENGTH,
    MEAN_ACCEPTANCE_LENGTH_CI95,
    SPEEDUP,
)


def _num(value: Any, ci95: Any = None, digits: int = 3) -> str:
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "-"
    text = f"{value:.{digits}f}"
    return text + (f" ± {ci95:.{digits}f}" if isinstance(ci95, int | float) and math.isfinite(ci95) else "")


def _band(band: dict) -> str:
    high = "∞" if band["high"] is None else f"{band['high']:g}"
    return f"[{band['low']:g}, {high})"


def _row(band: dict) -> str:
    taus = ", ".join(f"{t:g}" for t in band["tau_decs"])
    if band["route"] != "speculative":
        best = band.get("best_candidate")
        closest = (
            f"best: {best['draft_name']}, γ={best['gamma']}, speedup {_num(**_s(best))}" if best else "-"
        )
        return (
            f"| {_band(band)} | {taus} | no speculation | - | - | {band['basis']} | {closest} | - | - | - |"
        )
    e = band["expected"]
    return (
        f"| {_band(band)} | {taus} | `{band['draft']}` | {band['draft_name']} | {band['gamma']} | "
        f"{band['basis']} | {_num(**_s(band))} | "
        f"{_num(e.get(ACCEPTANCE_RATE), e.get(ACCEPTANCE_RATE_CI95))} | "
        f"{_num(e.get(MEAN_ACCEPTANCE_LENGTH), e.get(MEAN_ACCEPTANCE_LENGTH_CI95))} | "
        f"{_num(e.get(DRAFT_ACCEPTANCE), e.get(DRAFT_ACCEPTANCE_CI95))} |"
    )


def _s(candidate: dict) -> dict:
    return {"value": candidate[SPEEDUP]["value"], "ci95": candidate[SPEEDUP]["ci95"]}


def _batch_label(entry: dict) -> str:
    return f"[{entry['low']}, {'∞' if entry['high'] is None else entry['high']})"


def _batch_cell(entry: dict) -> str:
    """One batch band of one temperature band: γ and speedup, or 0 (no speculation)."""
    if entry["route"] != "speculative":
        return "0"
    return f"{entry['gamma']} ({_num(**_s(entry))})"


def batch_table(plan: dict) -> list[str]:
    """γ per (temperature band, batch-size band), with the speedup behind it; empty with one batch band."""
    bands = plan["bands"]
    columns = bands[0].get("batch_sizes", []) if bands else []
    if len(columns) < 2:
        return []
    return [
        "## γ per batch size",
        "",
        "Each cell: γ for requests at that temperature decoded in a batch of that many rows, with the "
        "speedup it is expected to give (95% interval) at the column's modelled B (a batch of b rows takes "
        "the largest modelled B ≤ b); 0 is no speculation. A band keeps one draft, the one chosen at the "
        "smallest B (a server loads one draft per deployment): a larger B takes that draft's best γ. "
        "`routing.json` gives each entry's reason, `vllm/<band>.json` carries the column as vLLM's "
        "`num_speculative_tokens_per_batch_size` where the γ differ. The modelled speedups hold for the "
        "hardware the step costs were timed on (above); a GPU batches differently from a CPU, so time them "
        "where you serve.",
        "",
        "| band (τ) | draft | " + " | ".join(f"B {_batch_label(c)}" for c in columns) + " |",
        "|---|---|" + "---|" * len(columns),
        *(
            f"| {_band(band)} | {band.get('draft_name') or '-'} | "
            + " | ".join(_batch_cell(e) for e in band["batch_sizes"])
            + " |"
            for band in bands
        ),
        "",
    ]


def export_readme(plan: dict) -> str:
    """Markdown for an export folder."""
    sweep, target, rule = plan["sweep"], plan["target"], plan["rule"]
    engines = plan["engines"]
    lines = [
        f"# Serving plan of sweep `{sweep['name']}`",
        "",
        f"From {sweep['source']} (spec key `{sweep['spec_key']}`), test set `{sweep['test_set']}`; target "
        f"(verifier) `{target['name_or_path']}` ({', '.join(target['architectures'])}, vocabulary "
        f"{target['vocab_size']}); step costs: {plan.get('step_costs_summary', '-')}.",
        "",
        "A request at temperature τ is served by the band whose [low, high) holds τ. Bands are represented "
        "by "
        "the sweep's τ_dec measurements inside them (the band's figures are at its binding τ_dec, where its "
        "speedup is smallest). Speedup is *measured* (wall time, where the sweep timed it) or *modelled* "
        "(the expected tokens per step against the timed step costs), with its 95% interval; the table is "
        "at the smallest batch size; a band gets **no speculation** when no draft's interval "
        f"lies wholly above {rule['min_speedup']:g}. Expected acceptance: acceptance rate α "
        "(accepted / tested), "
        "mean acceptance length (1 + accepted / verification steps, vLLM's definition) and draft acceptance "
        "(accepted / drafted, vLLM's and HF's counting), all with 95% intervals.",
        "",
        "| band (τ) | τ_dec | draft folder | draft | γ | basis | speedup | acceptance rate | "
        "mean acceptance length | draft acceptance |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(_row(band) for band in plan["bands"]),
        "",
        *batch_table(plan),
        "## How to serve each band",
        "",
        f"- **vLLM {engines['vllm']}**: `vllm/<band>.sh` is the launch line; `vllm/<band>.json` the "
        "`--speculative-config` for the draft-model method (`method: draft_model`, `num_speculative_tokens` "
        "= γ, `draft_sample_method: probabilistic`: the draft samples at the request's temperature, the "
        "speculative sampling these figures describe; vLLM's default greedy drafting accepts less at τ > 0). "
        "Where a band's γ differs by batch size, the config adds `num_speculative_tokens_per_batch_size`: "
        "inclusive `[first, last, γ]` ranges of the running batch size from 1, the last open, "
        "`num_speculative_tokens` their largest.",
        f"- **SGLang {engines['sglang']}**: `sglang/<band>.sh` is the launch line; `sglang/<band>.json` the "
        "STANDALONE arguments: `--speculative-num-steps` = γ and `--speculative-num-draft-tokens` = γ + 1 "
        "(SGLang counts the verified root token too). SGLang drafts the draft's top-1 token, so its "
        "acceptance at τ > 0 differs from the figures above. It gets one γ, the smallest batch size's: "
        "SGLang's `--speculative-adaptive` (with `--speculative-adaptive-config`, candidate steps per batch "
        "size) only drives EAGLE/EAGLE3 drafts and is switched off for STANDALONE (a separate draft model), "
        "so no adaptive config is written.",
        "- **transformers** (assisted generation): `specray.serving.router.Router` reads `routing.json` and "
        "`specray.serving.assisted.AssistedServer` serves a request by its temperature (one sequence at a "
        "time: the γ of batch size 1); `Router.route(τ, batch_size)` gives the γ for a batch; "
        "`specray export --verify` checks the plan's acceptance against what HF measures.",
        "",
        "One server per band: a deployment routes requests by temperature to the server of their band. The "
        "draft folders are HF models (safetensors + tokenizer) whose `config.json` has a `specray_config` "
        "block: the verifier, the KD recipe, the sweep's keys and the recommended γ per band.",
        "",
        "Band files: " + ", ".join(f"`{band['alias']}` {_band(band)}" for band in plan["bands"]) + ".",
        "",
    ]
    return "\n".join(lines)
