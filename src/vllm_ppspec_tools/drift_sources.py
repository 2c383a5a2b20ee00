"""Read a vLLM release's Python sources without importing them (the drift tool's reader).

``Sources`` gives the parsed ``.py`` files of a wheel or a directory;
``find`` follows ``Class.method`` through imports and base classes to its
definition (a :class:`Found`: the node and its file, or why not);
``node_source`` is the node's text as ``inspect.getsource`` gives it.
"""

from __future__ import annotations

import ast
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Node = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


class Sources:
    """The ``.py`` files of one vLLM release: a wheel (zip) or a directory above ``vllm/``."""

    def __init__(self, read: Callable[[str], str | None]):
        self._read = read
        self._trees: dict[str, tuple[str, ast.Module] | None] = {}
        self._paths: dict[str, str] = {}

    @classmethod
    def of_wheel(cls, wheel: Path) -> Sources:
        archive = zipfile.ZipFile(wheel)
        names = set(archive.namelist())

        def read(path: str) -> str | None:
            return archive.read(path).decode() if path in names else None

        return cls(read)

    @classmethod
    def of_dir(cls, root: Path) -> Sources:
        def read(path: str) -> str | None:
            file = root / path
            return file.read_text() if file.is_file() else None

        return cls(read)

    def module(self, name: str) -> tuple[str, ast.Module] | None:
        """(text, tree) of a module, or None if the release has no such module."""
        if name not in self._trees:
            base = name.replace(".", "/")
            self._paths[name] = base + ".py"
            text = self._read(base + ".py")
            if text is None:
                self._paths[name] = base + "/__init__.py"
                text = self._read(base + "/__init__.py")
            self._trees[name] = None if text is None else (text, ast.parse(text))
        return self._trees[name]

    def path(self, name: str) -> str:
        """The file a module read by :meth:`module` came from (``vllm/.../x.py``)."""
        return self._paths[name]


@dataclass
class Found:
    """Where an attribute path led: a def/class node, or why it stopped."""

    text: str = ""
    node: Node | None = None
    other: bool = False  # an assignment or import: present, no source to compare
    runtime_only: bool = False  # an attribute of a function object
    missing: str = ""
    path: str = ""  # the file of a def/class node


def _member(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The last statement of ``body`` that binds ``name`` (def, class, assignment, import)."""
    hit: ast.stmt | None = None
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if stmt.name == name:
                hit = stmt
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                hit = stmt
        elif isinstance(stmt, ast.ImportFrom | ast.Import):
            if any((a.asname or a.name).split(".")[0] == name for a in stmt.names):
                hit = stmt
        elif isinstance(stmt, ast.If | ast.Try):
            inner = _member(list(ast.iter_child_nodes(stmt)), name)  # type: ignore[arg-type]
            hit = inner or hit
    return hit


def _imported_module(stmt: ast.ImportFrom, module: str) -> str:
    if not stmt.level:
        return stmt.module or ""
    package = module.split(".")[: -stmt.level]
    return ".".join(package + ([stmt.module] if stmt.module else []))


def find(sources: Sources, module: str, path: str, depth: int = 0) -> Found:
    """Follow ``path`` (``Class.method``) in ``module``, through ``from x import y``
    and through base classes defined in the release."""
    loaded = sources.module(module)
    if loaded is None:
        return Found(missing=f"{module} (module)")
    text, tree = loaded
    head, _, rest = path.partition(".")
    stmt = _member(tree.body, head)
    if stmt is None:
        return Found(missing=f"{module}:{path}")
    if isinstance(stmt, ast.ImportFrom) and depth < 5:
        alias = next(a for a in stmt.names if (a.asname or a.name) == head)
        target = _imported_module(stmt, module)
        return find(sources, target, alias.name + ("." + rest if rest else ""), depth + 1)
    node: ast.stmt = stmt
    while rest:
        head, _, rest = rest.partition(".")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return Found(runtime_only=True)
        if not isinstance(node, ast.ClassDef):
            return Found(other=True)
        member = _member(node.body, head)
        if member is None:
            tail = head + ("." + rest if rest else "")
            inherited = _from_bases(sources, module, tree, node, tail)
            if inherited is not None:
                return inherited
            return Found(missing=f"{module}:{path}")
        node = member
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return Found(text=text, node=node, path=sources.path(module))
    return Found(other=True)


def _from_bases(
    sources: Sources, module: str, tree: ast.Module, cls: ast.ClassDef, path: str
) -> Found | None:
    for base in cls.bases:
        if isinstance(base, ast.Name):
            stmt = _member(tree.body, base.id)
            if isinstance(stmt, ast.ClassDef):
                found = find(sources, module, f"{base.id}.{path}", 1)
            elif isinstance(stmt, ast.ImportFrom):
                alias = next(a for a in stmt.names if (a.asname or a.name) == base.id)
                found = find(sources, _imported_module(stmt, module), f"{alias.name}.{path}", 1)
            else:
                continue
            if not found.missing:
                return found
    return None


def node_source(text: str, node: Node) -> str:
    """The node's lines as ``inspect.getsource`` returns them (decorators included)."""
    lines = text.splitlines(keepends=True)
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    assert node.end_lineno is not None
    return "".join(lines[start - 1 : node.end_lineno])
