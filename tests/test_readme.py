"""The README stays short enough to read in five minutes, the docs stay a reference,
and their links hold.

README.md is at most 10 KB and docs/*.md at most 150 KB together; no docs page
has a dated section heading (dated entries and rehearsal logs go to
CHANGELOG.md or beside their JSON in results/); every relative link in the
README and in docs/*.md points at a file or folder that exists; every
``vllm-ppspec-<tool>`` command the README and docs name is a console script of
pyproject.toml.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MAX_README_BYTES = 10 * 1024
MAX_DOCS_BYTES = 150 * 1024
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
# A markdown heading (outside code blocks) that holds a date such as 2026-12-04.
DATED_HEADING = re.compile(r"^#{1,6} .*\b(?:19|20)\d\d-\d\d-\d\d\b.*$", re.M)
FENCED = re.compile(r"^```.*?^```", re.S | re.M)
# [text](target): the target up to a space or the closing parenthesis.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)[^)]*\)")


def relative_links(page: Path) -> list[str]:
    """The page's link targets that are paths in the repository (no URL, no
    in-page anchor), without their ``#section``."""
    out = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def test_the_readme_is_at_most_10_kb():
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes, over {MAX_README_BYTES}"


def test_the_docs_are_at_most_150_kb_together():
    sizes = {p.name: len(p.read_bytes()) for p in DOCS}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    assert total <= MAX_DOCS_BYTES, f"docs/*.md are {total} bytes, over {MAX_DOCS_BYTES}: {largest}"


def dated_headings(text: str) -> list[str]:
    """The markdown headings of ``text`` that hold a date, code blocks left out."""
    return [m.group(0) for m in DATED_HEADING.finditer(FENCED.sub("", text))]


def test_the_dated_heading_finder():
    text = (
        "# Page\n\n## A run (2026-12-04)\n\nmeasured 2026-12-04\n\n"
        "```\n# 2026-12-05 a comment\n```\n"
    )
    assert dated_headings(text) == ["## A run (2026-12-04)"]
    assert dated_headings("## Layout\n\nA line from 2026-12-04.\n") == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_no_docs_page_has_a_dated_section(page):
    found = dated_headings(page.read_text())
    assert not found, f"{page.name}: dated headings {found} belong in CHANGELOG.md or results/"


def test_the_link_finder_reads_markdown_links():
    page = REPO / "README.md"
    links = relative_links(page)
    assert "docs/support.md" in links and "docs/install.md" in links
    assert not [t for t in links if t.startswith(("http", "#"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    missing = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"


def test_the_commands_named_in_the_docs_exist():
    scripts = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
    named = {
        cmd for page in PAGES for cmd in re.findall(r"\bvllm-ppspec-[a-z][a-z-]*", page.read_text())
    }
    assert "vllm-ppspec-demo" in named
    assert named <= scripts, sorted(named - scripts)
