"""Which draft for a real target: draft candidates side by side by cost ratio c and acceptance.

    .venv/bin/specray models fetch smollm2-135m-instruct; scripts/fetch_data.sh   # once
    .venv/bin/python -m benchmarks.specdec.drafts [--sweep sweeps/smollm2.yaml] [--record FILE]
    .venv/bin/python -m benchmarks.specdec.drafts --quick   # a smoke check on a micro zoo

Each candidate (`--candidate NAME='YAML'`, repeatable; default: cuts of 1, 2 and 4 of the target's layers
and a fresh 2-layer model of the target's width) is the sweep's `models.draft` in one `specray run` of the
sweep, one after another (so the step-cost timings never share the machine), at the sweep's offline
settings reduced to one draft: offline KD at τ_kd 0 (`teacher.temperatures=[0.0]`), one replicate, the
analytic estimator at τ_dec 0 and 1. The teacher's shard is made by the first run and reused by the others;
the drafts, step costs and cells are each candidate's own. Further key=value overrides go to every run.

Per candidate it prints the draft's parameters, c = T_d / T_t (the step-cost stage), the in-domain acceptance
rate α at τ_dec 0 and 1 with its 95% interval over test prompts, and the modelled speedup (the eval's γ)
of the distilled draft and of the un-distilled one: the trade a default is picked by (a cheaper draft
accepts less), and the training's seconds. The runs' folders and logs stay under `--out`; run again on the
same `--out`, each `specray run` reuses what it finished (the sweep's own resume) and the figures are read
again from its cells. `--quick` runs one fresh candidate on the micro zoo (sweeps/tiny.yaml shrunk, 2 steps).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import REPO

CANDIDATES = {
    "cut1": "{cut: {layers: 1}}",
    "cut2": "{cut: {layers: 2}}",
    "cut4": "{cut: {layers: 4}}",
    "fresh2": "{fresh: {hidden_size: 576, num_layers: 2, num_heads: 9, intermediate_size: 1536}}",
}
ONE_DRAFT = [
    "distill.paradigms=[offline]",
    "teacher.temperatures=[0.0]",
    "distill.replicates=1",
    "eval.temperatures=[0.0,1.0]",
    "eval.estimators=[analytic]",
]
DRAFT_FOLDER = "offline__tau_kd=0"  # the one draft of ONE_DRAFT
QUICK_CANDIDATES = {
    "fresh1": "{fresh: {hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}}"
}


def run_candidate(name: str, ref: str, args: argparse.Namespace) -> dict[str, float | str]:
    """One `specray run` with this draft; its figures from the run's report/cells.csv."""
    log_path = args.out / f"{name}.log"
    command = [
        str(Path(sys.executable).with_name("specray")),
        "run",
        args.sweep,
        f"name=drafts_{name}",
        f"models.draft={ref}",
        *args.base,  # the quick mode's micro sweep, under the one-draft reduction
        *ONE_DRAFT,
        f"output_dir={args.out}",
        f"tracking.uri=sqlite:///{args.out / 'mlflow.db'}",
        *args.overrides,
    ]
    print(f"{name}: {ref} (log: {log_path})", flush=True)
    start = time.monotonic()
    with log_path.open("w") as log:
        done = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - start
    if done.returncode:
        tail = "\n".join(log_path.read_text().splitlines()[-15:])
        raise SystemExit(f"{name}: specray run exited {done.returncode} after {seconds:.0f} s:\n{tail}")
    figures: dict[str, float | str] = {"candidate": name, "draft": ref}
    folder = args.out / f"drafts_{name}"
    figures |= _cells(folder / "report" / "cells.csv")
    figures["draft_parameters"] = _parameters(folder / "drafts")
    # the training's own seconds (finished.json), also when a re-run reuses the draft
    finished = folder / "drafts" / DRAFT_FOLDER / "finished.json"
    figures["train_seconds"] = round(json.loads(finished.read_text())["seconds"], 1)
    print(f"{name}: {_row(figures)} ({seconds:.0f} s)", flush=True)
    return figures


def _cells(path: Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if row["test_set"] != "in_domain" or row["estimator"] != "analytic":
                continue
            figures["c"] = float(row["c"])
            tau = f"{float(row['tau_dec']):g}"
            if row["draft"] == "non-distill":
                figures[f"speedup_undistilled_tau{tau}"] = float(row["speedup_model"])
                figures[f"alpha_undistilled_tau{tau}"] = float(row["acceptance_rate"])
            else:
                figures[f"alpha_tau{tau}"] = float(row["acceptance_rate"])
                figures[f"alpha_ci95_tau{tau}"] = float(row["acceptance_rate_ci95"])
                figures[f"speedup_tau{tau}"] = float(row["speedup_model"])
                figures[f"speedup_ci95_tau{tau}"] = float(row["speedup_model_ci95"])
                figures["gamma"] = float(row["gamma"])
    return figures


def _parameters(drafts: Path) -> int:
    """Distinct parameters of the finished draft (a tied head counted once)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(drafts / DRAFT_FOLDER)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


def _row(f: dict) -> str:
    return (
        f"{f['draft_parameters'] / 1e6:.1f}M parameters, c {f['c']:.3f}, "
        f"α τ0 {f['alpha_tau0']:.3f} ± {f['alpha_ci95_tau0']:.3f}, α τ1 {f['alpha_tau1']:.3f} ± "
        f"{f['alpha_ci95_tau1']:.3f}, speedup τ0 {f['speedup_tau0']:.3f}, τ1 {f['speedup_tau1']:.3f} "
        f"(un-distilled {f['speedup_undistilled_tau0']:.3f}, {f['speedup_undistilled_tau1']:.3f})"
    )


def table(results: list[dict]) -> list[dict[str, str]]:
    rows = []
    for f in results:
        rows.append(
            {
                "draft": f"`{f['draft']}`",
                "parameters": f"{f['draft_parameters'] / 1e6:.1f}M",
                "c": f"{f['c']:.3f}",
                "α τ_dec 0": f"{f['alpha_tau0']:.3f} ± {f['alpha_ci95_tau0']:.3f}",
                "α τ_dec 1": f"{f['alpha_tau1']:.3f} ± {f['alpha_ci95_tau1']:.3f}",
                "S τ_dec 0": f"{f['speedup_tau0']:.3f} ± {f['speedup_ci95_tau0']:.3f}",
                "S τ_dec 1": f"{f['speedup_tau1']:.3f} ± {f['speedup_ci95_tau1']:.3f}",
                "S un-distilled 0 / 1": "{:.3f} / {:.3f}".format(
                    f["speedup_undistilled_tau0"], f["speedup_undistilled_tau1"]
                ),
                "train s": f"{f['train_seconds']:.0f}",
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default="sweeps/smollm2.yaml")
    parser.add_argument(
        "--candidate",
        action="append",
        metavar="NAME=YAML",
        help="a models.draft to try (repeatable); default: " + ", ".join(CANDIDATES),
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/drafts"), help="the runs' folders and logs")
    parser.add_argument("--record", help="write the figures to this results file")
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few steps: a smoke check")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = parser.parse_args()
    candidates = dict(QUICK_CANDIDATES if args.quick else CANDIDATES)
    args.base = []
    if args.quick:
        from benchmarks.quick import QUICK_OVERRIDES

        args.sweep = "sweeps/tiny.yaml"
        args.base = [*QUICK_OVERRIDES, "distill.steps=2", "eval.timing_precision=0.5"]
    if args.candidate:
        try:
            candidates = dict(item.split("=", 1) for item in args.candidate)
        except ValueError:
            parser.error("--candidate takes NAME=YAML, e.g. cut3='{cut: {layers: 3}}'")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"{len(candidates)} candidates on {args.sweep}, one after another; {os.cpu_count()} cores", flush=True
    )
    results = [run_candidate(name, ref, args) for name, ref in candidates.items()]
    rows = table(results)
    print("\n| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(row.values()) + " |")
    if args.record:
        from specray.cli.results import write_results

        command = " ".join(["python", "-m", "benchmarks.specdec.drafts", *sys.argv[1:]])
        kept = (
            "draft_parameters",
            "c",
            "alpha_tau0",
            "alpha_tau1",
            "speedup_tau0",
            "speedup_tau1",
            "train_seconds",
        )
        figures = {f["candidate"]: {k: round(f[k], 4) for k in kept} for f in results}
        write_results(
            Path(args.record),
            command,
            figures,
            {"Candidates": rows},
            recorded_by="recorded by `benchmarks/specdec/drafts.py --record`",
        )


if __name__ == "__main__":
    main()
