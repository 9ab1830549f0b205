"""mkdocs hooks: the site is docs/ plus three pages that live outside it, with GitHub's link and anchor rules.

The Markdown is written for GitHub, where README.md links `docs/concepts.md` and a manual page links
`../benchmarks/README.md`. The site keeps those files where they are and adds them as pages
(`front-page.md`, `benchmarks.md`, `changelog.md`), then rewrites each page's relative links from where the
file really lies to where the site puts it. A link to a repository file that is no page (a sweep, a
script, LICENSE) becomes its path in code, since the site has no copy of it; a link to nothing is left as
it is, for mkdocs' own check to report (`--strict` fails on it). Anchors follow GitHub's slugs, which keep
non-ASCII letters (`#τ_dec-...`) and do not merge repeated hyphens, so one `#anchor` works in both places
(the same rule as `tests/unit/test_docs_links.py`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
OUTSIDE = {
    "README.md": "front-page.md",
    "benchmarks/README.md": "benchmarks.md",
    "CHANGELOG.md": "changelog.md",
}
LINK = re.compile(r"(!?\[(?:[^\[\]]|\[[^\]]*\])*\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def github_slug(text: str, separator: str = "-") -> str:
    """GitHub's anchor of a heading's text: lower-cased, punctuation dropped, each space a hyphen."""
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", separator)


def on_config(config: Any) -> Any:
    config.mdx_configs.setdefault("toc", {})["slugify"] = github_slug
    return config


def on_files(files: Files, config: Any) -> Files:
    for source, page in OUTSIDE.items():
        files.append(File.generated(config, page, abs_src_path=str(REPO / source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Rewrite the page's relative links from the file's real place in the repository to the site's."""
    real = _real_source(page.file.src_uri)
    site_dir = Path(page.file.src_uri).parent
    lines, fence = [], ""
    for line in markdown.splitlines():
        match = FENCE.match(line)
        if fence or match:
            if match:
                fence = "" if fence and match.group(1)[0] == fence[0] else (fence or match.group(1))
            lines.append(line)
            continue
        lines.append(LINK.sub(lambda m: _rewrite(m, real, site_dir), line))
    return "\n".join(lines)


def _real_source(src_uri: str) -> Path:
    for source, page in OUTSIDE.items():
        if page == src_uri:
            return REPO / source
    return DOCS / src_uri


def _rewrite(match: re.Match[str], real: Path, site_dir: Path) -> str:
    opening, target, closing = match.groups()
    if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target, re.IGNORECASE):
        return match.group(0)  # an external address, or an anchor on the page itself
    path, hash_, anchor = target.partition("#")
    resolved = (real.parent / path).resolve()
    if not resolved.exists() or not resolved.is_relative_to(REPO):
        return match.group(0)  # mkdocs reports it
    relative = resolved.relative_to(REPO).as_posix()
    if relative in OUTSIDE:
        on_site = Path(OUTSIDE[relative])
    elif resolved.is_relative_to(DOCS):
        on_site = resolved.relative_to(DOCS)
    else:  # a repository file the site has no copy of: its path, in code
        text = opening.lstrip("!")[1:-2]
        return f"`{relative}`" if text.strip("`") in (relative, resolved.name) else f"{text} (`{relative}`)"
    new_target = os.path.relpath(on_site, site_dir).replace(os.sep, "/") + (hash_ + anchor if hash_ else "")
    return f"{opening}{new_target}{closing}"
