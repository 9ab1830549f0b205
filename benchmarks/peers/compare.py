"""specray against what a user would otherwise pick: its distillation against TRL's GKDTrainer and SFTTrainer,
its teacher engine against transformers' `model.generate`. Prints the ratios and the run-time checks.

    pip install -e '.[peers]'                                                  # TRL, pinned
    .venv/bin/specray generate sweeps/tiny.yaml 'teacher.temperatures=[1.0]'   # the τ_kd shard, once
    .venv/bin/python -m benchmarks.peers.compare [--repeats 2] [--tau-kd 1.0]
    .venv/bin/python -m benchmarks.peers.compare --quick   # a smoke check on a micro zoo

On the real model pair (sweeps/smollm2.yaml: SmolLM2-135M-Instruct's GGUF file as the bf16 target, a 2-layer
draft cut from it, chat-template prompts, training under bf16 autocast on the CPU), fewer steps:

    .venv/bin/specray models fetch smollm2-135m-instruct
    .venv/bin/specray generate sweeps/smollm2.yaml 'teacher.temperatures=[1.0]'
    .venv/bin/python -m benchmarks.peers.compare --sweep sweeps/smollm2.yaml --repeats 1 \
        distill.steps=40 distill.online_steps=40

Without TRL it prints one line saying how to install it and exits 0.

Distillation: one finished draft per (paradigm, tool), each in a fresh process with one torch thread, at the
sweep's settings (`--sweep`, default sweeps/tiny.yaml, then the key=value overrides; both tools get the same
spec): its step counts (`distill.steps` offline, `distill.online_steps` online), `distill.batch_size`, λ
(`distill.onpolicy_fraction`), `distill.max_new_tokens`, FKL, τ_kd (`--tau-kd`), `distill.lr` with
`distill.warmup_steps` warm-up steps and a cosine to 10%, AdamW, clipping at `distill.max_grad_norm`,
checkpoints every `distill.checkpoint_every` steps, the teacher in `models.target.dtype`, and bf16 autocast
where `distill.cpu_autocast` is set (tiny.yaml: 600/400 steps, batch 16, lr 3e-3, 20 warm-up steps, fp32;
smollm2.yaml: 80/80 steps, batch 8, lr 5e-4, 10 warm-up steps, bf16 target and autocast). specray runs
`train_draft` (what a sweep runs per draft: setup, kept teacher states, the acceptance probe at the eval τ_dec
at the sweep's report cadence, `distill.report_every`, where the convergence test reads the curve —
`convergence.probe_due` —, checkpoints, publishing); TRL runs GKDTrainer (online) or SFTTrainer (offline) on
the same rows (token ids: the shard's prompts, chat-template ones included) in the same order, with
`bf16=True` where specray autocasts, checked at run time (`trl_side.py`: settings, batches, and the dtype
of a matmul's output under autocast). What cannot be matched is printed under "not matched". The tools
alternate which goes first across repeats.
Figures: s/step (the optimizer steps alone), s per finished draft (from reading the shard to the saved
draft; imports excluded on both sides), trained tokens per step (non-padding tokens of the batches), and
the quality of the finished drafts — CE and forward KL on held-out teacher rows (the in-domain test prompts,
teacher samples at τ_kd) and specray's analytic acceptance (`AcceptanceProbe`) at τ_dec 0 and 1.
The probe's share: the wall and CPU seconds spent building the probe and in its reports, over the
draft's. GKD flips one coin per batch for on-policy data where specray mixes per row; its λ-weighted figures
count its on-policy and fixed-data steps at weight λ and 1 − λ (what a per-row mix costs on average).

Teacher data: the teacher pool's transformers engine (`TransformersEngine.generate`, the target in
`models.target.dtype`) against batched `model.generate` (do_sample, temperature τ, top_k 0, top_p 1; its
logits processors checked), the same prompts (the train split's, in the sweep's template, encoded as the
engine encodes them) in the same length-sorted batches, the same `teacher.max_new_tokens`; tokens/s counts
response tokens up to and with the EOS, at batch `distill.batch_size` and `teacher.batch_size` (`--batches`).
Both in one process, the same loaded model, order alternating across repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.peers.jobs import specray_job, teacher_job, trl_job
from benchmarks.quick import REPO, quick_spec
from specray.config import SweepSpec, load_spec

TOOLS = ("specray", "trl")
PARADIGMS = ("online", "offline")
PEER = {"online": "TRL GKD", "offline": "TRL SFT"}
COLUMNS = (
    "paradigm",
    "tool",
    "steps",
    "s/step",
    "s per finished draft",
    "tokens/step",
    "CE",
    "FKL",
    "α τ_dec=0",
    "α τ_dec=1",
)
INSTALL = "skipped: TRL is not installed; `pip install -e '.[peers]'` to run benchmarks/peers/compare.py"
TINY = REPO / "sweeps" / "tiny.yaml"


def _spec(args: argparse.Namespace) -> SweepSpec:
    overrides = ["eval.empirical_temperatures=[]"]
    if args.quick:
        overrides += ["distill.steps=4", "distill.online_steps=4", "distill.report_every=2"]
        overrides += ["distill.checkpoint_every=2"]
    if args.quick:  # the micro zoo: sweeps/tiny.yaml shrunk (`--sweep` is refused with --quick)
        return quick_spec(overrides + list(args.overrides))
    return load_spec(Path(args.sweep), overrides + list(args.overrides))


def _describe(spec: SweepSpec) -> str:
    """The settings both tools run at, as the spec gives them."""
    d, m = spec.distill, spec.models
    target = f"target {m.target.source} {getattr(m.target, m.target.source)} ({m.target.dtype})"
    draft = f"draft {m.draft.source} {getattr(m.draft, m.draft.source)}"
    precision = "bf16 autocast" if d.cpu_autocast else "fp32 (no autocast)"
    return (
        f"sweep {spec.name}: {target}, {draft}; {spec.data.template} template; steps {d.steps} offline, "
        f"{d.online_steps} online; batch {d.batch_size}, lr {d.lr:g}, warm-up {d.warmup_steps}, λ "
        f"{d.onpolicy_fraction:g}, {d.max_new_tokens} new tokens; training {precision}; probe every "
        f"{d.report_every} steps at {len(spec.eval.temperatures)} τ_dec"
    )


# ---------------------------------------------------------------- one job per process


def run_job(args: argparse.Namespace) -> None:
    """`--job` mode: one measurement in this fresh process, its result as JSON in `--result`."""
    torch.set_num_threads(1)
    spec, job = _spec(args), json.loads(args.job)
    if job["kind"] == "teacher":
        result = teacher_job(spec, job["batch"], job["prompts"], args.tau_kd, job["hf_first"])
    else:
        run = specray_job if job["kind"] == "specray" else trl_job
        result = run(spec.for_paradigm(job["paradigm"]), job["paradigm"], args.tau_kd, Path(job["output"]))
    Path(args.result).write_text(json.dumps(result))


def spawn(args: argparse.Namespace, job: dict, folder: Path) -> dict:
    result = folder / f"result-{len(list(folder.iterdir()))}.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.peers.compare",
        "--job",
        json.dumps(job),
        "--result",
        str(result),
    ]
    command += ["--tau-kd", str(args.tau_kd), "--sweep", args.sweep] + (["--quick"] if args.quick else [])
    command += list(args.overrides)
    subprocess.run(command, check=True)
    return json.loads(result.read_text())


# ---------------------------------------------------------------- the driver


def _summarise(tool: str, result: dict, fraction: float) -> dict:
    """s/step, s per draft and tokens per step; for GKD also the λ-weighted s/step and s per draft."""
    if tool == "specray":
        steps = result["steps"]
        per_step = result["step_seconds_total"] / steps
        shares = {key: result[key] for key in ("probe share", "probe share (CPU)", "probes")}
        return {
            "s/step": per_step,
            "s/draft": result["seconds"],
            "tokens/step": result["tokens"] / steps,
        } | shares
    seconds, onpolicy = result["step_seconds"], result["onpolicy"]
    steps = len(seconds)
    summary = {
        "s/step": sum(seconds) / steps,
        "s/draft": result["seconds"],
        "tokens/step": sum(result["tokens"]) / steps,
        "onpolicy": sum(onpolicy) / steps,
    }
    on = [s for s, o in zip(seconds, onpolicy, strict=True) if o]
    off = [s for s, o in zip(seconds, onpolicy, strict=True) if not o]
    if on and off:  # what the draft would cost had exactly λ of its steps been on-policy
        weighted = fraction * statistics.fmean(on) + (1 - fraction) * statistics.fmean(off)
        summary["s/step λ"] = weighted
        summary["s/draft λ"] = result["seconds"] - sum(seconds) + weighted * steps
    return summary


def measure_distillation(args, spec: SweepSpec, folder: Path) -> tuple[dict, dict]:
    """Per (paradigm, tool): the summaries of every repeat, and the drafts of the first."""
    runs: dict = {(p, t): [] for p in args.paradigms for t in TOOLS}
    drafts: dict = {}
    checks: list[str] = []
    notes: list[str] = []
    for repeat in range(args.repeats):
        for paradigm in args.paradigms:
            for tool in TOOLS if repeat % 2 == 0 else TOOLS[::-1]:
                output = folder / f"{paradigm}-{tool}-{repeat}"
                job = {"kind": tool, "paradigm": paradigm, "output": str(output)}
                result = spawn(args, job, folder)
                summary = _summarise(tool, result, spec.distill.onpolicy_fraction)
                runs[paradigm, tool].append(summary)
                shown = ", ".join(f"{k} {v:.4g}" for k, v in summary.items())
                print(f"repeat {repeat + 1} {paradigm:>7} {tool:>7}: {shown}", flush=True)
                drafts.setdefault((paradigm, tool), result.get("draft", str(output)))
                checks += [line for line in result.get("checks", []) if line not in checks]
                notes += [line for line in result.get("notes", []) if line not in notes]
    print("\nrun-time checks (TRL did what it was configured to do; each raises otherwise):")
    for line in checks:
        print(f"  {line}")
    print("not matched between the tools (reported, not corrected):")
    for line in notes or ["nothing beyond the above"]:
        print(f"  {line}")
    return runs, drafts


def measure_teacher(args, folder: Path) -> dict:
    rates: dict = {batch: [] for batch in args.batches}
    for repeat in range(args.repeats):
        for batch in args.batches:
            job = {"kind": "teacher", "batch": batch, "prompts": args.prompts, "hf_first": repeat % 2 == 1}
            result = spawn(args, job, folder)
            rates[batch].append(result)
            print(
                f"repeat {repeat + 1} teacher batch {batch}: engine {result['engine']:.0f} tokens/s, "
                f"generate {result['generate']:.0f} tokens/s ({result['engine_tokens']} / "
                f"{result['generate_tokens']} tokens)",
                flush=True,
            )
    print(f"  {rates[args.batches[0]][0]['check']}")
    return rates


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def report(spec: SweepSpec, runs: dict, quality: dict, rates: dict, args) -> tuple[dict, list[dict]]:
    """Print the medians and the ratios; return them as a results file's figures and table rows."""
    d = spec.distill
    figures: dict = {}
    rows: list[dict] = []
    steps = {p: spec.distill.steps_for(p) for p in args.paradigms}
    precision = ", bf16 autocast" if d.cpu_autocast else ""
    setting = (
        f"{spec.name}, τ_kd {args.tau_kd:g}, batch {d.batch_size}, lr {d.lr:g}, λ {d.onpolicy_fraction:g}"
        f"{precision}, 1 thread"
    )
    print(f"\nmedians over {args.repeats} repeat(s), {setting}:")
    print(
        "| paradigm | tool | steps | s/step | s per finished draft | tokens/step | CE | FKL "
        "| α τ_dec=0 | α τ_dec=1 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for paradigm in args.paradigms:
        for tool in TOOLS:
            r, q = runs[paradigm, tool], quality[paradigm, tool]
            name = "specray" if tool == "specray" else PEER[paradigm]
            cells = [paradigm, name, steps[paradigm], f"{_median(r, 's/step'):.4f}"]
            cells += [f"{_median(r, 's/draft'):.1f}", f"{_median(r, 'tokens/step'):.0f}", f"{q['ce']:.4f}"]
            cells += [f"{q['fkl']:.4f}", f"{q['alpha'][0.0]:.4f}", f"{q['alpha'][1.0]:.4f}"]
            print("| " + " | ".join(map(str, cells)) + " |")
            rows.append(dict(zip(COLUMNS, map(str, cells), strict=True)))
    q = quality["undistilled"]
    alpha = f"{q['alpha'][0.0]:.4f} | {q['alpha'][1.0]:.4f}"
    print(f"| — | un-distilled draft | 0 | | | | {q['ce']:.4f} | {q['fkl']:.4f} | {alpha} |")
    if "online" in args.paradigms:
        figures["online_draft_ratio"] = _online_ratios(runs)
    for paradigm in args.paradigms:
        ours, reports = runs[paradigm, "specray"], steps[paradigm] // d.report_every + 1
        print(
            f"{paradigm}: the acceptance probe's share of a finished draft ({_median(ours, 'probes'):.0f} of "
            f"{reports} reports, {len(spec.eval.temperatures)} τ_dec each): "
            f"{_median(ours, 'probe share'):.3f} of its wall time, "
            f"{_median(ours, 'probe share (CPU)'):.3f} of its CPU time"
        )
    if "offline" in args.paradigms:
        ours, sft = runs["offline", "specray"], runs["offline", "trl"]
        ratio = _median(ours, "s/draft") / _median(sft, "s/draft")
        per_step = _median(ours, "s/step") / _median(sft, "s/step")
        print(
            f"offline SeqKD, s per finished draft, specray / TRL SFT: {ratio:.3f} (per step {per_step:.3f})"
        )
        figures |= {"offline_draft_ratio": round(ratio, 3), "offline_step_ratio": round(per_step, 3)}
    engine = {b: statistics.median(r["engine"] / r["generate"] for r in rates[b]) for b in args.batches}
    shown = ", ".join(f"{v:.2f} at batch {b}" for b, v in engine.items())
    print(f"teacher engine / model.generate tokens/s: {shown}")
    figures |= {f"teacher_batch{b}_ratio": round(v, 2) for b, v in engine.items()}
    return figures, rows


def _online_ratios(runs: dict) -> float:
    gkd = runs["online", "trl"]
    if all("s/step λ" in r for r in gkd):
        fraction = statistics.fmean(r["onpolicy"] for r in gkd)
        print(
            f"GKD drew {fraction:.3f} of its batches on-policy; λ-weighted: "
            f"{_median(gkd, 's/step λ'):.4f} s/step, {_median(gkd, 's/draft λ'):.1f} s per draft"
        )
    ours = runs["online", "specray"]
    ratio = _median(ours, "s/draft") / _median(gkd, "s/draft")
    weighted = _median(ours, "s/draft") / _median(gkd, "s/draft λ") if "s/draft λ" in gkd[0] else float("nan")
    per_step = _median(ours, "s/step") / _median(gkd, "s/step")
    print(
        f"online KD, s per finished draft, specray / TRL GKD: {ratio:.3f} "
        f"(λ-weighted {weighted:.3f}; per step {per_step:.3f})"
    )
    return round(ratio, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--tau-kd", type=float, default=1.0)
    parser.add_argument(
        "--prompts", type=int, default=None, help="teacher data: default 256 (8 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few steps: a smoke check")
    parser.add_argument("--paradigms", type=lambda text: tuple(text.split(",")), default=PARADIGMS)
    parser.add_argument(
        "--sweep", default=str(TINY), help="the sweep both tools run on (default sweeps/tiny.yaml)"
    )
    parser.add_argument(
        "--batches",
        type=lambda text: tuple(int(b) for b in text.split(",")),
        help="teacher data batch sizes: default distill.batch_size,teacher.batch_size (2,4 with --quick)",
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the sweep, both sides")
    parser.add_argument("--record", help="write the figures to this results file (docs/results/peers.json)")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick and Path(args.sweep).resolve() != TINY:
        parser.error("--quick runs on the micro zoo (sweeps/tiny.yaml shrunk): drop --sweep")
    try:
        import trl  # noqa: F401
    except ImportError:
        print(INSTALL)
        return
    if args.job:
        run_job(args)
        return
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.prompts = args.prompts or (8 if args.quick else 256)
    torch.set_num_threads(1)
    spec = _spec(args)  # quick: makes the micro zoo's shards here, once
    if args.batches is None:
        args.batches = (
            (2, 4) if args.quick else tuple(sorted({spec.distill.batch_size, spec.teacher.batch_size}))
        )
    print(_describe(spec), flush=True)
    print(f"{os.cpu_count()} cores, load average before: {os.getloadavg()[0]:.2f}", flush=True)
    from benchmarks.peers.evaluation import draft_quality

    with tempfile.TemporaryDirectory() as root:
        runs, drafts = measure_distillation(args, spec, Path(root))
        rates = measure_teacher(args, Path(root))
        quality = draft_quality(spec, args.tau_kd, drafts)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    figures, rows = report(spec, runs, quality, rates, args)
    if args.record:  # docs/results/peers.json: the figures README.md quotes
        from specray.cli.results import write_results

        command = " ".join(["python", "-m", "benchmarks.peers.compare", *sys.argv[1:]])
        by = "recorded by `benchmarks/peers/compare.py --record`"
        write_results(Path(args.record), command, figures, {"Medians": rows}, recorded_by=by)


if __name__ == "__main__":
    main()
