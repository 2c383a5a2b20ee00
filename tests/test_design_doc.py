"""docs/design.md describes the code as it is.

- Its "Layout" section maps ``src/vllm_ppspec``: every folder that holds a
  module once, and every module of the package root once; every path it lists
  exists (each fenced block starts with its root, e.g. ``src/vllm_ppspec/``,
  and lists one folder or module per line relative to it).
- Its table of hooks per mode matches the steps classes in ``runner/``.
- It carries no dates and no name of the removed comparison modes.
- Every ``vllm_ppspec...`` dotted name and every ``something.py`` path it
  mentions exists (a dotted name: the longest prefix that is a module, then
  names defined in that module, read with ``ast``; a path: in the repository,
  under ``src/``, ``src/vllm_ppspec/`` or ``src/vllm_ppspec_tools/``, or, for
  ``vllm/...``, in the installed vLLM).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DESIGN = REPO / "docs" / "design.md"
SRC = REPO / "src"
PLUGIN = SRC / "vllm_ppspec"
TOOLS = SRC / "vllm_ppspec_tools"
PATH_BASES = (REPO, SRC, PLUGIN, TOOLS)
REMOVED = ("VLLM_PPSPEC_ASYNC_LANES", "ROUND_PREPOST", "two_batch")
DATE = re.compile(r"\b(?:19|20)\d\d-")
DOTTED = re.compile(r"\bvllm_ppspec(?:_tools)?(?:\.\w+)+")
PY_PATH = re.compile(r"(?<![\w/.-])([\w./-]*\w\.py)\b")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def design_text() -> str:
    return DESIGN.read_text()


def section(text: str, title: str) -> str:
    """The body of the ``## title`` section, up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f'docs/design.md has no "## {title}" section'
    return match.group(1)


def layout_blocks(text: str) -> dict[str, list[str]]:
    """Each fenced block of "Layout": its root folder -> the folders and modules listed."""
    blocks: dict[str, list[str]] = {}
    for block in FENCE.findall(section(text, "Layout")):
        lines = block.splitlines()
        root = lines[0].split()[0]
        blocks[root] = [
            line.split()[0]
            for line in lines[1:]
            if line.startswith(" ") and line.split() and line.split()[0].endswith((".py", "/"))
        ]
    return blocks


def test_the_layout_maps_every_plugin_folder_and_root_module_once():
    listed = layout_blocks(design_text()).get("src/vllm_ppspec/")
    assert listed is not None, 'no "src/vllm_ppspec/" block in "Layout"'
    tree = {p.name for p in PLUGIN.glob("*.py")} | {
        p.parent.relative_to(PLUGIN).as_posix() + "/"
        for p in PLUGIN.rglob("*.py")
        if p.parent != PLUGIN
    }
    duplicates = sorted({p for p in listed if listed.count(p) > 1})
    assert not duplicates, f"listed more than once: {duplicates}"
    missing, extra = sorted(tree - set(listed)), sorted(set(listed) - tree)
    assert not missing, f"missing from the Layout map: {missing}"
    assert not extra, f"the Layout map lists no such folder or module: {extra}"


def test_every_path_in_the_layout_exists():
    blocks = layout_blocks(design_text())
    assert blocks
    missing = [
        f"{root}{path}"
        for root, paths in blocks.items()
        for path in paths
        if not (REPO / root / path).exists()
    ]
    assert not missing, f"Layout lists missing files: {missing}"


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}


def _methods(cls: ast.ClassDef) -> set[str]:
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_the_parts_per_rank_and_mode_match_the_steps_classes():
    """The runner section's table names every part class of ``runner/steps/``
    (a ``Part`` subclass other than the steps objects themselves), and no other."""
    parts: set[str] = set()
    for path in sorted((PLUGIN / "runner" / "steps").rglob("*.py")):
        for name, cls in _classes(path).items():
            bases = {b.id for b in cls.bases if isinstance(b, ast.Name)}
            if bases & {"Part", "_Lanes"} and not name.startswith("_") and name != "Steps":
                parts.add(name)
    text = section(design_text(), "The runner: one steps object per rank and mode")
    table = text[text.index("| mode | last rank | other ranks |") :].split("\n\n")[0]
    rows = re.findall(r"^\| [^|\n]* \| ([^|\n]*) \| ([^|\n]*) \|$", table, re.M)
    documented = {n for row in rows for cell in row for n in re.findall(r"`([A-Z]\w+)`", cell)}
    assert parts and documented == parts, f"design.md names {documented}, the code {parts}"


def test_no_dates_and_no_removed_modes():
    text = design_text()
    assert not DATE.findall(text), "a date in docs/design.md"
    found = [word for word in REMOVED if word.lower() in text.lower()]
    assert not found, f"docs/design.md names removed things: {found}"


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body``'s statements, those inside its ``if`` and ``try`` blocks included."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            handlers = [h.body for h in getattr(node, "handlers", [])]
            for inner in (node.body, node.orelse, getattr(node, "finalbody", []), *handlers):
                out.extend(_statements(inner))
    return out


def _defines(path: Path, names: list[str]) -> bool:
    """Whether ``path`` defines ``names[0]`` at top level, ``names[1]`` in it, ..."""
    body: list[ast.stmt] = ast.parse(path.read_text()).body
    for name in names:
        found: ast.stmt | None = None
        for node in _statements(body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                hit = node.name == name
            elif isinstance(node, ast.Assign):
                hit = any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            elif isinstance(node, ast.AnnAssign):
                hit = isinstance(node.target, ast.Name) and node.target.id == name
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                hit = any((a.asname or a.name.split(".")[0]) == name for a in node.names)
            else:
                hit = False
            if hit:
                found = node
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def dotted_name_exists(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = SRC.joinpath(*parts[:i])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return _defines(path, parts[i:]) if parts[i:] else True
    return False


def py_path_exists(path: str) -> bool:
    if path.startswith("vllm/"):
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("vLLM is not installed: its paths cannot be checked")
        return (Path(list(spec.submodule_search_locations)[0]).parent / path).is_file()
    return any((base / path).is_file() for base in PATH_BASES)


def test_the_name_checks_catch_missing_names():
    assert dotted_name_exists("vllm_ppspec.compat.registry.REGISTRY")
    assert dotted_name_exists("vllm_ppspec.runner.steps.base.Part.before_execute")
    assert not dotted_name_exists("vllm_ppspec.runner.mode")
    assert not dotted_name_exists("vllm_ppspec.runner.steps.base.Steps.no_such_hook")
    assert py_path_exists("runner/mixin.py") and py_path_exists("tests/test_layout.py")
    assert not py_path_exists("runner/two_batch.py")


def test_every_dotted_name_exists():
    names = sorted(set(DOTTED.findall(design_text())))
    assert names, "no vllm_ppspec name found: the pattern is wrong"
    missing = [n for n in names if not dotted_name_exists(n)]
    assert not missing, f"docs/design.md names what does not exist: {missing}"


def test_every_py_path_exists():
    paths = sorted(set(PY_PATH.findall(design_text())))
    assert len(paths) > 40, "few .py paths found: the pattern is wrong"
    missing = [p for p in paths if not py_path_exists(p)]
    assert not missing, f"docs/design.md names missing files: {missing}"
