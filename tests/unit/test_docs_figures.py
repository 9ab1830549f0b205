"""The docs say only what is so: every quoted figure agrees with its results file, and every file, sweep
setting and command a page names exists.

- Figures. A results file (`docs/results/NAME.json`) is written by the run that measured it
  (`specray/cli/results.py`). A page shows its figures in a rendered block or inline between
  `<!--r:NAME.PATH-->` and `<!--/r-->`; either must equal the file's. Outside those, a manual page
  (README.md, docs/*.md) may not state a measured wall time, cost ratio, model size or verdict count at
  all: it links to docs/results.md. benchmarks/README.md keeps its component measurements beside their
  scripts, each with its commit, hardware and command.
- Names. In code (spans and blocks) of README.md, docs/ and benchmarks/README.md, and in the sweeps'
  header comments: a repository path must exist, a `section.field` setting must be a field of the sweep
  spec, and a `specray COMMAND --option` must be a command with that option.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel, Tag

from specray.cli import app
from specray.cli.results import BLOCK, INLINE, load_results, quote_problems, render, transcribed
from specray.config import SweepSpec
from specray.faults import POINTS as FAULT_POINTS
from tests.conftest import REPO
from tests.unit.test_docs_links import CODE_SPAN, FENCE

RESULTS = load_results(REPO / "docs" / "results")
PAGES = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md", *(REPO / "docs").rglob("*.md")])
MANUAL = [p for p in PAGES if p.parent.name != "benchmarks" and p.name != "results.md"]
SWEEP_HEADERS = sorted((REPO / "sweeps").glob("*.yaml"))
# A measured figure stated outright: a wall time, a cost ratio, a model size, a count of verdicts.
MEASURED = re.compile(
    r"\b\d+ min \d+ s\b|\b\d+(?:[.,]\d+)? ?(?:s|min|minutes|h|hours) wall\b|\bc ?[=≈] ?0\.\d"
    r"|\b\d+(?:\.\d+)?M[- ]param|\(\d+(?:\.\d+)?M\)|\b\d+ of \d+ (?:verdicts|rows)\b"
)
DIARY = re.compile(r"load average|\buptime\b|\(target: |was wrong in that table", re.IGNORECASE)
REPO_PATH = re.compile(
    r"(?<![\w/.<-])((?:specray|sweeps|configs|benchmarks|tests|infra|scripts|docs)/[\w./*-]*[\w/*])"
)
SETTING = re.compile(r"(?<![\w.$/=,-])((?:models|data|teacher|distill|eval|tune|tracking|ray)(?:\.[\w]+)+)")
# `specray ...` where a command starts: at the start of the code, after `$ `, `&&`, `;`, `|` or `(`,
# behind environment assignments, a path to the script (`.venv/bin/`) or `/usr/bin/time -v`
COMMAND = re.compile(
    r"(?:^|&&|;|\||\()\s*(?:\$ )?(?:[A-Z_]+=\S*\s+)*(?:/usr/bin/time(?: -v)?\s+)?(?:\S*/)?specray"
    r"((?: +[^\s|;&#`]+)*)"
)
FILE_SUFFIXES = ("py", "yaml", "yml", "json", "md", "sh", "txt", "toml")


# ---------------------------------------------------------------- reading a page


def code_and_prose(text: str) -> tuple[list[str], list[str]]:
    """(code, prose): the lines of fenced blocks (a trailing `\\` joins the next) plus the code spans of
    the other lines; and those other lines without their code spans."""
    code, prose, fence, pending = [], [], "", ""
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence:
            if match and match.group(1)[0] == fence[0]:
                fence = ""
            elif line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
            else:
                code.append(pending + line)
                pending = ""
        elif match:
            fence = match.group(1)
        else:
            code += [span.group(0).strip("`").replace("\\|", " ") for span in CODE_SPAN.finditer(line)]
            prose.append(CODE_SPAN.sub("", line))
    return code, prose


def header_comments(path: Path) -> list[str]:
    """A sweep's header: its comment lines before the first key, without the `# `."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return lines


# ---------------------------------------------------------------- what a name must be


def setting_exists(path: str) -> bool:
    """Whether a dotted path names a field of the sweep spec; a mapping's keys (`data.test_sets.NAME`)
    and a list's indices (`distill.divergence.1`, as error messages name items) are taken as given."""
    return _resolves(SweepSpec, path.split("."))


def _resolves(annotation: object, parts: list[str]) -> bool:
    if not parts:
        return True
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(parts[0])
        return field is not None and _resolves(field.annotation, parts[1:])
    if origin is dict:
        return _resolves(typing.get_args(annotation)[1], parts[1:])
    if origin is list:
        return parts[0].isdigit() and _resolves(typing.get_args(annotation)[0], parts[1:])
    if origin is typing.Annotated:  # a tagged union arm: error paths may name its tag (`.preset`)
        inner, *metadata = typing.get_args(annotation)
        tagged = any(isinstance(m, Tag) and m.tag == parts[0] for m in metadata)
        return _resolves(inner, parts[1:] if tagged else parts)
    return any(_resolves(arm, parts) for arm in typing.get_args(annotation))


def command_problem(words: list[str]) -> str | None:
    """What is wrong with `specray WORDS...`, or None: an unknown command or option."""
    command = typer.main.get_command(app)
    path = ["specray"]
    options = [w for w in words if w.startswith("-")]
    rest = [w for w in words if not w.startswith("-")]
    for option in options if not rest else []:  # `specray --version`
        if option.split("=")[0] not in _options(command):
            return f"specray {option}: no such option"
    while hasattr(command, "commands") and rest:  # a group: the next word names its command
        sub = command.commands.get(rest[0])
        if sub is None:
            return f"{' '.join(path)} {rest[0]}: no such command"
        command, path, rest = sub, [*path, rest.pop(0)], rest
    for option in options:
        name = re.match(r"-{1,2}[\w-]+", option)
        if name and name.group(0) not in _options(command) | {"--help"}:
            return f"{' '.join(path)} {name.group(0)}: no such option"
    return None


def _options(command: object) -> set[str]:
    return {name for param in command.params for name in [*param.opts, *param.secondary_opts]}  # type: ignore[attr-defined]


def name_problems(code: list[str]) -> list[str]:
    """Repository paths, settings and commands in these code lines that do not exist."""
    problems = []
    for line in code:
        for path in REPO_PATH.findall(line):
            path = path.split("::")[0]
            found = any(REPO.glob(path)) if "*" in path else (REPO / path).exists()
            made = (REPO / f"{path}.example").exists()  # `.env`: made from `.env.example`
            placeholder = re.search(r"/[A-Z_]{2,}(?:\.\w+)?$", path)  # `docs/results/NAME.json`
            if not (found or made or placeholder):
                problems.append(f"{path}: no such file")
        for setting in SETTING.findall(line):
            # `ray.train.report` is Ray's API, not a setting, unless it is set
            is_setting = not setting.startswith("ray.") or re.search(rf"{re.escape(setting)}\s*[=:]", line)
            is_file = setting.rsplit(".", 1)[-1] in FILE_SUFFIXES  # `distill.py`
            is_module = (REPO / "specray" / setting.replace(".", "/")).with_suffix(".py").exists()
            is_fault = setting in FAULT_POINTS  # SPECRAY_FAULTS=teacher.batch=2
            if is_setting and not (is_file or is_module or is_fault) and not setting_exists(setting):
                problems.append(f"{setting}: no such setting")
        for match in COMMAND.finditer(line):
            words = [w.strip("()[]") for w in match.group(1).split()]
            if words and not words[0].isupper():  # `specray COMMAND --help`: a placeholder
                problem = command_problem([w for w in words if w])
                problems += [problem] if problem else []
    return problems


def figure_problems(prose: list[str]) -> list[str]:
    """Measured figures a manual page states outside a results block or inline marker."""
    unquoted = INLINE.sub("", BLOCK.sub("", "\n".join(prose)))
    found = MEASURED.finditer(unquoted)
    return [f"unsourced figure {m.group(0)!r}: quote docs/results/*.json" for m in found]


def page_problems(path: Path, text: str | None = None) -> list[str]:
    """Everything wrong with a page (its own text, unless given). RELIABILITY.md's bad-input table names
    wrong input on purpose (`eval.gama=3`); test_reliability_doc.py checks it against the tested cases."""
    text = path.read_text() if text is None else text
    checked = re.sub(r"\n## Bad input\n.*?(?=\n## )", "\n", text, flags=re.DOTALL)
    checked = BLOCK.sub("", checked)  # a rendered results block names paths as its run had them: a record
    code, _ = code_and_prose(checked)
    _, prose = code_and_prose(text)
    problems = quote_problems(text, RESULTS) + name_problems(code)
    if path in MANUAL:
        problems += figure_problems(prose)
    problems += [f"lab diary: {m.group(0)!r}" for m in DIARY.finditer(text)]
    return problems


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_page_quotes_its_figures_and_names_what_exists(path: Path) -> None:
    assert page_problems(path) == []


@pytest.mark.parametrize("path", SWEEP_HEADERS, ids=lambda p: p.name)
def test_sweep_headers_name_what_exists(path: Path) -> None:
    header = header_comments(path)
    assert name_problems(header) == []
    assert [m.group(0) for m in DIARY.finditer("\n".join(header))] == []


def test_every_results_file_is_shown_on_the_results_page() -> None:
    shown = set(BLOCK.findall((REPO / "docs" / "results.md").read_text()))
    benchmarks = {"peers", "peers_smollm2", "drafts_smollm2"}  # shown in benchmarks/README.md
    assert set(RESULTS) - benchmarks <= shown
    assert benchmarks <= set(BLOCK.findall((REPO / "benchmarks" / "README.md").read_text()))
    for name, results in RESULTS.items():
        assert results["name"] == name and {"command", "commit", "date", "machine", "figures"} <= set(results)


def test_a_wrong_figure_in_a_manual_page_fails() -> None:
    page = REPO / "docs" / "concepts.md"
    wall = RESULTS["tiny"]["figures"]["wall_seconds"]
    right = f"`make demo` takes <!--r:tiny.wall_seconds-->{_shown('tiny', 'wall_seconds')}<!--/r-->.\n"
    assert page_problems(page, page.read_text() + right) == []
    wrong = right.replace(_shown("tiny", "wall_seconds"), f"{int(wall // 60) + 3} min 5 s")
    assert page_problems(page, page.read_text() + wrong) == [
        f"tiny.wall_seconds: the page says '{int(wall // 60) + 3} min 5 s', docs/results/tiny.json "
        f"'{_shown('tiny', 'wall_seconds')}'"
    ]
    unsourced = "`make demo` takes 12 min 5 s on two cores, and c = 0.23.\n"
    assert page_problems(page, page.read_text() + unsourced) == [
        "unsourced figure '12 min 5 s': quote docs/results/*.json",
        "unsourced figure 'c = 0.2': quote docs/results/*.json",
    ]
    assert page_problems(page, page.read_text() + "<!--r:tiny.no_such_figure-->1<!--/r-->") == [
        "tiny: no figure no_such_figure"
    ]


def test_an_unknown_setting_command_option_or_file_fails() -> None:
    page = REPO / "docs" / "sweeps.md"
    planted = (
        "Set `eval.gama` or run\n```bash\nspecray run sweeps/tiny.yaml distill.online_step=600\n"
        "specray frobnicate sweeps/tiny.yaml\nspecray bench q.jsonl --zoo --temprature 1\n```\n"
        "See `sweeps/no_such.yaml` and `specray/cli/none.py`; `data.test_sets.rag.source.path` is fine.\n"
    )
    assert page_problems(page, page.read_text() + planted) == [
        "eval.gama: no such setting",
        "distill.online_step: no such setting",
        "specray frobnicate: no such command",
        "specray bench --temprature: no such option",
        "sweeps/no_such.yaml: no such file",
        "specray/cli/none.py: no such file",
    ]


def test_a_stale_results_block_fails() -> None:
    text = (REPO / "docs" / "results.md").read_text()
    name = next(iter(BLOCK.findall(text)))
    stale = text.replace(f"<!-- results {name} -->\n", f"<!-- results {name} -->\nedited by hand\n", 1)
    assert quote_problems(stale, RESULTS) == [
        f"results block {name}: differs from docs/results/{name}.json; re-render it"
    ]


def test_a_transcribed_block_must_say_how_old_it_is() -> None:
    text = (REPO / "docs" / "results.md").read_text()
    name = next(n for n in BLOCK.findall(text) if not transcribed(RESULTS[n]))
    copied = dict(RESULTS[name], recorded_by="transcribed from docs/results.md at 507e38e")
    copied.pop("older", None)
    problems = quote_problems(text, {**RESULTS, name: copied})
    assert problems == [
        f"results block {name}: transcribed from an older page; re-record it, or say in the file's `older` "
        "field how much older than the code it is"
    ]
    dated = copied | {"older": "its run is 193 commits older than this page"}
    assert quote_problems(text.replace(render(RESULTS[name]), render(dated)), {**RESULTS, name: dated}) == []
    assert "**Older than the code:** its run is 193 commits older than this page." in render(dated)


def _shown(name: str, path: str) -> str:
    from specray.cli.results import figure, format_figure

    return format_figure(path, figure(RESULTS[name], path))


def test_the_front_page_stays_an_entry_point() -> None:
    """README.md: at most 250 lines, and exactly two commands for a fresh machine."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    quick_start = text.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in quick_start.splitlines()] == ["make demo", "make test"]
