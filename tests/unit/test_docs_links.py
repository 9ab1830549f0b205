"""Every relative link and image in the Markdown docs resolves inside the repository.

Covers README.md, docs/**/*.md and benchmarks/README.md: a link's file must exist, must lie inside the
repository (a clone has nothing beside it), and a `#anchor` into a Markdown file must name one of its
headings under GitHub's slug rules. Links inside code blocks and code spans are text, not links.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.conftest import REPO

DOCS = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md", *(REPO / "docs").rglob("*.md")])
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fence = [], ""
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = ""
        elif match:
            fence = match.group(1)
        else:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as rendered, lower-cased, punctuation dropped (letters,
    digits, `_` and `-` stay, in any script), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file offers: its headings' slugs (a repeated slug gets -1, -2, ...) and
    explicit `<a id=...>` / `<a name=...>` anchors."""
    text = path.read_text()
    found, seen = set(), Counter()
    for line in prose_lines(text):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            found.add(f"{base}-{seen[base]}" if seen[base] else base)
            seen[base] += 1
    return found | set(HTML_ANCHOR.findall(text))


def links(text: str) -> list[str]:
    """The targets of the inline links, images and link definitions outside code."""
    targets = []
    for line in prose_lines(text):
        line = CODE_SPAN.sub("", line)
        targets += INLINE_LINK.findall(line) + REFERENCE_LINK.findall(line)
    return targets


def broken_links(path: Path, text: str | None = None) -> list[str]:
    """What is wrong with each relative link of the page at `path` (its text, unless given), one line
    per broken link."""
    problems = []
    for target in links(path.read_text() if text is None else text):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(file_part)).resolve() if file_part else path.resolve()
        if not resolved.is_relative_to(REPO):
            problems.append(f"{target}: points outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
            problems.append(f"{target}: no heading #{anchor} in {resolved.relative_to(REPO)}")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_the_docs_have_links_to_check() -> None:
    assert len(DOCS) >= 10
    assert sum(len(links(path.read_text())) for path in DOCS) > 50


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Composition search: `specray tune`", "composition-search-specray-tune"),
        ("2. A tracking server: `infra/mlflow/`", "2-a-tracking-server-inframlflow"),
        ("Training-data sources (`distill.data_sources`)", "training-data-sources-distilldata_sources"),
        ("τ_dec and the [report](report.md)", "τ_dec-and-the-report"),
    ],
)
def test_slugs_follow_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_broken_links_are_caught() -> None:
    page = REPO / "docs" / "planted.md"  # read as if it were there: nothing is written
    text = (
        "# Planted\n\n[gone](no-such-file.md) [bad anchor](concepts.md#no-such-heading) "
        "[outside](../../elsewhere/DESIGN.md) [fine](concepts.md#definitions) `[code](not-a-link.md)`\n"
        "```\n[in a block](nor-this.md)\n```\n![figure](figures/missing.png)\n"
    )
    problems = broken_links(page, text)
    assert [p.split(":")[0] for p in problems] == [
        "no-such-file.md",
        "concepts.md#no-such-heading",
        "../../elsewhere/DESIGN.md",
        "figures/missing.png",
    ]
