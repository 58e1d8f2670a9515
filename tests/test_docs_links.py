"""Every relative link of README.md and docs/*.md reaches a file that exists and, where it names
an anchor (``guide.md#a-heading``), a heading of that file: a guide renamed or a section retitled
cannot leave the README's "what next" list or the docs index (docs/README.md) pointing nowhere
(issue 43). Anchors are GitHub's: the heading's text, lower-cased, without punctuation other than
``-`` and ``_``, spaces as ``-``, a repeated heading suffixed ``-1``, ``-2``, ...
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(path: Path) -> set[str]:
    """GitHub's anchor of each Markdown heading of ``path`` (outside fenced blocks)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(path: Path) -> list[str]:
    """The relative link targets of ``path`` (outside fenced blocks; web and mail links left out)."""
    return [t for t in LINK.findall(FENCE.sub("", path.read_text())) if not re.match(r"^[a-z]+:", t)]


def test_the_anchor_rule_is_githubs():
    page = REPO / "docs" / "results.md"
    assert "what-make-demo-prints" in anchors(page)  # "What `make demo` prints": backticks dropped
    assert "does-the-background-cause-the-drop" in anchors(page)  # "?" dropped


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_relative_link_reaches_its_file_and_heading(page: Path):
    broken = []
    for target in links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading #{anchor}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_and_the_index_link_every_guide():
    """The README's "what next" list and docs/README.md name every guide in docs/ (issue 43)."""
    guides = {p.name for p in (REPO / "docs").glob("*.md")}
    readme = {Path(t.partition("#")[0]).name for t in links(REPO / "README.md") if t.startswith("docs/")}
    index = {Path(t.partition("#")[0]).name for t in links(REPO / "docs" / "README.md") if not t.startswith("../")}
    assert guides <= readme, guides - readme
    assert guides - {"README.md"} <= index, guides - {"README.md"} - index


def test_the_readme_is_short_and_its_demo_excerpt_is_from_the_full_output():
    """The README stays within 250 lines, and its excerpt of `make demo`'s output (the first
    unlabelled block) is at most 15 lines, each a line of the whole output in docs/results.md, so
    refreshing one without the other fails here (issue 43)."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    blocks = re.finditer(r"^```([^\n]*)\n(.*?)^```", readme, re.M | re.S)  # fences in pairs, in order
    excerpt = next((m.group(2) for m in blocks if not m.group(1).strip()), None)
    assert excerpt, "the README shows no excerpt of make demo's output"
    lines = excerpt.splitlines()
    results = (REPO / "docs" / "results.md").read_text()
    full = re.search(r"^## What `make demo` prints\n.*?^```\n(.*?)^```", results, re.M | re.S)
    assert full, "docs/results.md has no block of make demo's output"
    assert 5 <= len(lines) <= 15, len(lines)
    assert not [line for line in lines if line not in full.group(1).splitlines()]
