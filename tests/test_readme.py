"""The README stays short enough to read in five minutes, and the docs' links hold.

README.md is at most 12 KB; every relative link in it and in docs/*.md points
at a file or folder that exists; every ``vllm-ppspec-<tool>`` command the
README and docs name is a console script of pyproject.toml.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MAX_README_BYTES = 12 * 1024
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
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


def test_the_readme_is_at_most_12_kb():
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes, over {MAX_README_BYTES}"


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
