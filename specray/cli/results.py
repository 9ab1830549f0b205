"""Results files: the one source of every figure the docs quote about a shipped sweep or benchmark.

A results file (`docs/results/<name>.json`) holds one run: the command, the commit, the machine, the date,
and its figures — wall time, stage times and peak memory, the step costs' c, the models' sizes, the counts
of drafts, cells and verdicts — plus the report's verdict tables. A run writes it itself when
`SPECRAY_RECORD` names a file (`record_run`, called by `specray run` once the sweep is done), so no figure
is copied by hand. `SPECRAY_RECORD_SINCE` (Unix seconds) counts the wall time from then instead of from the
process's start (`make record-demo` counts `make demo`'s setup too), and `SPECRAY_RECORD_COMMAND` names the
command the user typed when it was not `specray ...` itself.

Pages quote a file in two ways, both checked by `tests/unit/test_docs_figures.py`:
- a block `<!-- results NAME -->` ... `<!-- /results -->` holds exactly what `render(NAME)` writes
  (`python scripts/results.py` rewrites every block after a results file changed);
- one figure inline, `<!--r:NAME.PATH-->13 min 48 s<!--/r-->`, where PATH is a key under `figures`
  (`wall_seconds`, `stages.zoo.seconds`, `c`, `models.draft_parameters`, `verdicts.reproduced`); the text
  between the markers must be what `format_figure` makes of the value. Both markers are HTML comments:
  GitHub and the docs site show only the figure.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import specray
from specray.cli.provenance import git_commit, machine

RECORD_ENV, SINCE_ENV, COMMAND_ENV = "SPECRAY_RECORD", "SPECRAY_RECORD_SINCE", "SPECRAY_RECORD_COMMAND"
BLOCK = re.compile(r"<!-- results (\w+) -->\n.*?<!-- /results -->", re.DOTALL)
INLINE = re.compile(r"<!--r:(\w+)\.([\w.]+)-->(.*?)<!--/r-->")
VERDICT_WORDS = ("reproduced", "not reproduced", "inconclusive")  # the report's verdicts


# ---------------------------------------------------------------- writing one from a finished run


def record_run(spec: Any, outcome: Any, command_name: str = "run") -> Path | None:
    """Write the results file `SPECRAY_RECORD` names from a finished sweep, garden or search (`outcome`
    has `stages` and a report; `command_name`: the `specray` command that ran it); do nothing when it is
    unset. Returns the file written."""
    target = os.environ.get(RECORD_ENV)
    if not target:
        return None
    costs = getattr(outcome, "step_costs", None)
    figures: dict[str, Any] = {
        "wall_seconds": round(_wall_seconds(), 1),
        "stages": {
            name.replace(" ", "_"): {"seconds": round(v["seconds"], 1), "peak_gib": round(v["peak_gib"], 2)}
            for name, v in outcome.stages.items()
        },
        "models": _model_sizes(spec),
    }
    if files := _model_files(spec):
        figures["model_files"] = files
    if costs is not None:
        figures["c"] = round(costs.cost_ratio(costs.batch_sizes[0]), 4)
        if costs.source == "measured":
            figures["target_step_ms"] = round(1e3 * costs.target[costs.batch_sizes[0]][1].seconds, 3)
    if hasattr(outcome, "records"):
        figures["cells"] = len(outcome.records)
        figures["drafts"] = len({r.draft for r in outcome.records})
    figures |= getattr(outcome, "figures", {})  # what a run measures beyond these (a tune's gains, its ρ)
    tables = report_tables(_report_file(outcome))
    figures["verdicts"] = verdict_counts(tables)
    command = os.environ.get(COMMAND_ENV) or shlex.join(["specray", *sys.argv[1:]])
    recorded_by = f"recorded by `specray {command_name}` (SPECRAY_RECORD)"
    return write_results(Path(target), command, figures, tables, recorded_by, sweep=spec.name)


def write_results(
    path: Path,
    command: str,
    figures: Mapping[str, Any],
    tables: Mapping[str, list[dict[str, str]]],
    recorded_by: str = "recorded by `specray run` (SPECRAY_RECORD)",
    **extra: Any,
) -> Path:
    """Write a results file: the figures and tables with the commit, machine, date and command."""
    results = {
        "name": path.stem,
        **extra,
        "command": command,
        "commit": git_commit(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
        "machine": machine(),
        "specray": specray.__version__,
        "recorded_by": recorded_by,
        "figures": figures,
        "tables": tables,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    return path


def _wall_seconds() -> float:
    since = os.environ.get(SINCE_ENV)
    if since:
        return time.time() - float(since)
    return time.time() - _process_start()


def _process_start() -> float:
    """When this process started (Unix seconds): its interpreter start-up and imports count too."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        return int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return _IMPORTED  # no /proc: from when the CLI imported this module


def record_checks(checks: Sequence[Any]) -> Path | None:
    """Write the results file `SPECRAY_RECORD` names from `specray export --verify`'s band checks (one row
    per band: its route, the candidate, HF's acceptance and both decoders' speedups beside the plan's); do
    nothing when it is unset. Returns the file written."""
    target = os.environ.get(RECORD_ENV)
    if not target:
        return None
    rows = [
        {
            "band": f"τ {c.tau_dec:g}",
            "route": c.route,
            "draft, γ": f"{c.draft}, γ = {c.gamma}",
            "prompts": str(c.prompts),
            "HF draft acceptance (plan)": (
                f"{c.draft_acceptance:.3f} ± {c.draft_acceptance_ci95:.3f} "
                f"({c.predicted_draft_acceptance:.3f})"
            ),
            "specray's decoder: speedup (plan)": (
                f"{c.ours_speedup:.3f} ± {c.ours_speedup_ci95:.3f} ({c.predicted_speedup:.3f}, "
                f"{c.predicted_speedup_basis})"
            ),
            "HF speedup": f"{c.speedup:.3f} ± {c.speedup_ci95:.3f}",
            "HF's extra ms per step": f"{c.hf_overhead_ms_per_step:.1f}",
            "checks": ("HF inside" if c.agrees else "HF OUTSIDE")
            + (", ours within ±10%" if c.ours_agrees else ", ours OUTSIDE ±10%"),
        }
        for c in checks
    ]
    figures = {
        "bands_checked": len(checks),
        "bands_routed": sum(c.route == "speculative" for c in checks),
        "hf_inside": sum(c.agrees for c in checks),
        "ours_within_10pct": sum(c.ours_agrees for c in checks),
        "wall_seconds": round(_wall_seconds(), 1),
    }
    command = os.environ.get(COMMAND_ENV) or shlex.join(["specray", *sys.argv[1:]])
    recorded_by = "recorded by `specray export --verify` (SPECRAY_RECORD)"
    return write_results(Path(target), command, figures, {"Bands": rows}, recorded_by)


_IMPORTED = time.time()


def _model_sizes(spec: Any) -> dict[str, int]:
    """Parameters of the target and the draft, counted from their safetensors (nothing is loaded)."""
    from specray.models.sources import resolve_model_path

    sizes = {}
    for role in ("target", "draft"):
        folder = Path(resolve_model_path(getattr(spec.models, role), spec.models))
        if folder.is_dir():
            sizes[f"{role}_parameters"] = safetensors_parameters(folder)
    return sizes


def _model_files(spec: Any) -> dict[str, dict[str, str]]:
    """The GGUF file each model given as one came from (name, sha256): whose weights the figures are of."""
    from specray.models.gguf import value_sha256
    from specray.named_files import gguf_path

    return {
        role: {"file": gguf_path(ref.gguf).name, "sha256": value_sha256(ref.gguf)}
        for role in ("target", "draft")
        if (ref := getattr(spec.models, role)).gguf is not None
    }


def safetensors_parameters(folder: Path) -> int:
    """The number of parameters stored in a model folder's safetensors files (a tied weight once)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (a safetensors handle is not a mapping)
                shape = weights.get_slice(name).get_shape()
                total += int(_product(shape))
    return total


def _product(shape: list[int]) -> int:
    result = 1
    for size in shape:
        result *= size
    return result


def _report_file(outcome: Any) -> Path | None:
    report = getattr(outcome, "report", None) or getattr(outcome, "report_dir", None)
    if report is None:
        return None
    report = Path(report)
    return report / "report.md" if report.is_dir() else report


def report_tables(report: Path | None) -> dict[str, list[dict[str, str]]]:
    """Every table of a report whose header has a `verdict` column, by the heading above it."""
    if report is None or not report.is_file():
        return {}
    tables: dict[str, list[dict[str, str]]] = {}
    heading, rows = "", []
    for line in [*report.read_text().splitlines(), ""]:
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if len(rows) > 2 and "verdict" in rows[0]:
            title = heading if heading not in tables else f"{heading} ({len(tables) + 1})"
            tables[title] = [dict(zip(rows[0], row, strict=False)) for row in rows[2:]]
        rows = []
    return tables


def verdict_counts(tables: Mapping[str, list[dict[str, str]]]) -> dict[str, int]:
    """How many rows of the verdict tables got each verdict."""
    counts = dict.fromkeys(VERDICT_WORDS, 0)
    for rows in tables.values():
        for row in rows:
            verdict = row.get("verdict", "").strip("* ")
            if verdict in counts:
                counts[verdict] += 1
    return {verdict.replace(" ", "_"): n for verdict, n in counts.items()}  # `verdicts.not_reproduced`


# ---------------------------------------------------------------- quoting one in a page


def load_results(folder: Path) -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def figure(results: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted `path` under `results["figures"]`; KeyError naming the path if absent."""
    value: Any = results["figures"]
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(f"{results['name']}: no figure {path}")
        value = value[part]
    return value


def format_figure(path: str, value: Any) -> str:
    """How a page shows a figure: durations as `13 min 48 s`, sizes in millions of parameters, memory in
    GiB, a `*_ratio` as `0.40x`, a relative `gain` (`gain_low`, `gain_high`) as `+12.3%`, other fractions
    to three decimals, counts as they are."""
    last = path.rsplit(".", 1)[-1]
    if last.endswith("seconds"):
        return duration(float(value))
    if last.endswith("parameters"):
        return f"{value / 1e6:.2f}M"
    if last.endswith("gib"):
        return f"{value:.2f} GiB"
    if last.endswith("_ms"):
        return f"{value:.2f} ms"
    if last.endswith("_ratio"):
        return f"{value:.2f}x"
    if last == "gain" or last.startswith("gain_"):  # a relative gain and its interval's ends
        return f"{value:+.1%}"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def duration(seconds: float) -> str:
    if seconds < 100:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def render(results: Mapping[str, Any]) -> str:
    """The block a page shows for one results file: where it came from, its figures, its tables."""
    where = results["machine"]
    gpu = where.get("gpu", "none")
    memory = f", {where['memory_gib']} GiB" if where.get("memory_gib") else ""
    hardware = f"{where['cores']} cores ({where['cpu']}){memory}, " + ("no GPU" if gpu == "none" else gpu)
    lines = [
        f"<!-- results {results['name']} -->",
        f"`{results['command']}` at `{results['commit']}` on {results['date']}; {hardware}.",
        f"Source: `docs/results/{results['name']}.json`, {results['recorded_by']}.",
        *([f"**Older than the code:** {results['older']}."] if results.get("older") else []),
        "",
        "| figure | value |",
        "|---|---:|",
        *[f"| {label} | {text} |" for label, text in _figure_rows(results["figures"])],
    ]
    for title, rows in results.get("tables", {}).items():
        lines += ["", f"**{title}**", "", *(_markdown_table(rows) if rows else ["none"])]
    return "\n".join([*lines, "<!-- /results -->"])


def _figure_rows(figures: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    rows = []
    for key, value in figures.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows += _figure_rows(value, f"{path}.")
        elif value is not None:
            rows.append((path, format_figure(path, value)))
    return rows


def _markdown_table(rows: list[Mapping[str, Any]]) -> list[str]:
    columns = list(dict.fromkeys(column for row in rows for column in row))
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows],
    ]


def rendered(text: str, results: Mapping[str, Mapping[str, Any]]) -> str:
    """`text` with every results block and inline figure rewritten from its file (one naming no file or
    figure is left as is, for `quote_problems` to report)."""

    def block(match: re.Match[str]) -> str:
        name = match.group(1)
        return render(results[name]) if name in results else match.group(0)

    def inline(match: re.Match[str]) -> str:
        name, path, _ = match.groups()
        try:
            return f"<!--r:{name}.{path}-->{format_figure(path, figure(results[name], path))}<!--/r-->"
        except KeyError:
            return match.group(0)

    return INLINE.sub(inline, BLOCK.sub(block, text))


CODE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1|(`+).+?\2", re.DOTALL | re.MULTILINE)


def transcribed(results: Mapping[str, Any]) -> bool:
    """Whether a results file holds figures copied from a page rather than written by the run itself."""
    return "transcribed" in results.get("recorded_by", "")


def quote_problems(text: str, results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What a page quotes that its results files do not say: stale blocks, and inline figures that name no
    results file or figure, or show another value than the file's (markers shown in code are examples)."""
    problems = []
    for match in BLOCK.finditer(text):
        name = match.group(1)
        if name not in results:
            problems.append(f"results block {name}: no docs/results/{name}.json")
        elif transcribed(results[name]) and not results[name].get("older"):
            problems.append(
                f"results block {name}: transcribed from an older page; re-record it, or say in the file's "
                "`older` field how much older than the code it is"
            )
        elif match.group(0) != render(results[name]):
            problems.append(f"results block {name}: differs from docs/results/{name}.json; re-render it")
    for name, path, shown in INLINE.findall(CODE.sub("", text)):
        if name not in results:
            problems.append(f"{name}.{path}: no docs/results/{name}.json")
            continue
        try:
            expected = format_figure(path, figure(results[name], path))
        except KeyError as e:
            problems.append(str(e.args[0]))
            continue
        if shown != expected:
            problems.append(f"{name}.{path}: the page says {shown!r}, docs/results/{name}.json {expected!r}")
    return problems
