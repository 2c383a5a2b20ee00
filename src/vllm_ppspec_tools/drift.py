"""What changed in a vLLM release for this plugin, read from its sources, not installed.

    vllm-ppspec-drift VERSION [--wheel PATH | --source DIR] [--cache DIR]

(``python -m vllm_ppspec_tools.drift`` runs the same.)

Downloads the ``vllm==VERSION`` wheel without its dependencies (``pip download
--no-deps``, cached under ``--cache``), or reads ``--wheel`` / an unpacked
``--source`` tree, and reports, against the vLLM installed here (which must be
the reference version, ``version_data.REFERENCE_VLLM_VERSION``):

* every private name in ``version_guard.PRIVATE_NAMES`` (version_data's used names
  and the patch registry's targets): present or missing;
* every mirrored function in ``version_data.MIRRORED_FUNCTIONS``: the source
  hash pinned for VERSION (the reference's pin for a release not supported),
  or changed, with the diff;
* every upstream method the plugin overrides (its runner, worker and scheduler
  classes: found from their MRO) or wraps (``vllm_ppspec.patches.PATCHED_NAMES``):
  the same source as installed, or changed, with the diff.

Exits 1 on any drift that ``version_data.EXPLAINED_DRIFT[VERSION]`` does not
explain, 0 otherwise. A name reached only at run time (an attribute set on a
function object, such as torch.compile's ``_torchdynamo_orig_callable``) is
reported as such and not counted.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import inspect
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CACHE = Path(os.environ.get("VLLM_PPSPEC_CACHE", Path.home() / ".cache" / "vllm-ppspec"))

Node = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


class Sources:
    """The ``.py`` files of one vLLM release: a wheel (zip) or a directory above ``vllm/``."""

    def __init__(self, read: Callable[[str], str | None]):
        self._read = read
        self._trees: dict[str, tuple[str, ast.Module] | None] = {}

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
            text = self._read(base + ".py")
            if text is None:
                text = self._read(base + "/__init__.py")
            self._trees[name] = None if text is None else (text, ast.parse(text))
        return self._trees[name]


@dataclass
class Found:
    """Where an attribute path led: a def/class node, or why it stopped."""

    text: str = ""
    node: Node | None = None
    other: bool = False  # an assignment or import: present, no source to compare
    runtime_only: bool = False  # an attribute of a function object
    missing: str = ""


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
        return Found(text=text, node=node)
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


def short_hash(source: str) -> str:
    """As ``version_guard.source_hash``: sha256 of the source, 16 hex digits."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def overridden() -> Iterator[tuple[str, str, str]]:
    """(module, qualname, installed source) of every upstream method that the
    plugin's runner, worker and scheduler classes override."""
    from vllm_ppspec.runner.cpu_runner import PPSpecCPUModelRunner
    from vllm_ppspec.runner.mixin import PPSpecGPUModelRunner
    from vllm_ppspec.sched.filled import PPSpecScheduler
    from vllm_ppspec.sched.lanes import PPSpecLaneScheduler
    from vllm_ppspec.workers.cpu import PPSpecCPUWorker
    from vllm_ppspec.workers.gpu import PPSpecGPUWorker

    seen: set[tuple[str, str]] = set()
    for cls in (
        PPSpecCPUModelRunner,
        PPSpecGPUModelRunner,
        PPSpecCPUWorker,
        PPSpecGPUWorker,
        PPSpecScheduler,
        PPSpecLaneScheduler,
    ):
        plugin = [k for k in cls.__mro__ if k.__module__.startswith("vllm_ppspec.")]
        upstream = [k for k in cls.__mro__ if k.__module__.startswith("vllm.")]
        names = {
            n for k in plugin for n, v in vars(k).items() if callable(v) or isinstance(v, property)
        }
        for name in sorted(names):
            owner = next((k for k in upstream if name in vars(k)), None)
            if owner is None:
                continue
            key = (owner.__module__, f"{owner.__qualname__}.{name}")
            if key in seen:
                continue
            seen.add(key)
            yield key[0], key[1], source_of(vars(owner)[name])


def source_of(member: Any) -> str:
    """``inspect.getsource`` of a function, method, classmethod or property (its getter)."""
    member = member.fget if isinstance(member, property) else member
    return inspect.getsource(getattr(member, "__func__", member))


def installed_source(module: str, qualname: str) -> str:
    import importlib

    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return source_of(obj)


@dataclass
class Report:
    version: str
    explained: dict[str, str]
    lines: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)

    def add(self, key: str, what: str, diff: str = "") -> None:
        why = self.explained.get(key)
        if why is None:
            self.drift.append(key)
            self.lines.append(f"  DRIFT {key}: {what}")
        else:
            self.lines.append(f"  explained {key}: {what} ({why})")
        if diff:
            self.lines.append(diff)


def _diff(old: str, new: str, name: str, version: str, pinned: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"{name} (vLLM {pinned})",
            f"{name} (vLLM {version})",
        )
    )


def check(sources: Sources, version: str) -> Report:
    from vllm_ppspec import patches
    from vllm_ppspec import version_data as data
    from vllm_ppspec import version_guard as guard

    pinned = data.REFERENCE_VLLM_VERSION
    if guard.installed_vllm_version() != pinned:
        raise SystemExit(
            f"drift: compares against the reference vLLM {pinned}, installed "
            f"here is {guard.installed_vllm_version()}: run it in the project's .venv"
        )
    report = Report(version, dict(data.EXPLAINED_DRIFT.get(version, {})))

    report.lines.append(f"private names ({len(guard.PRIVATE_NAMES)}):")
    for module, path in guard.PRIVATE_NAMES:
        found = find(sources, module, path)
        key = f"{module}:{path}"
        if found.missing:
            report.add(key, f"missing ({found.missing})")
        elif found.runtime_only:
            report.lines.append(f"  run time only {key}: set on a function object, not in source")
        else:
            report.lines.append(f"  present {key}")

    report.lines.append(f"mirrored functions ({len(data.MIRRORED_FUNCTIONS)}):")
    for module, qualname, pins, where in data.MIRRORED_FUNCTIONS:
        key = f"{module}:{qualname}"
        found = find(sources, module, qualname)
        if found.node is None:
            report.add(key, f"missing (copied in {where})")
            continue
        new = node_source(found.text, found.node)
        pin = guard.mirror_pin(pins, version)
        if short_hash(new) == pin == pins[pinned]:
            report.lines.append(f"  same {key}")
        elif short_hash(new) == pin:
            report.lines.append(f"  pinned {key}: changed since {pinned}, pinned for {version}")
        else:
            old = installed_source(module, qualname)
            report.add(key, f"changed (copied in {where})", _diff(old, new, key, version, pinned))

    targets = [(m, q, s) for m, q, s in overridden()]
    targets += [(m, q, installed_source(m, q)) for m, q in patches.PATCHED_NAMES]
    report.lines.append(f"overridden or wrapped upstream methods ({len(targets)}):")
    for module, qualname, old in targets:
        key = f"{module}:{qualname}"
        found = find(sources, module, qualname)
        if found.node is None:
            if found.missing:
                report.add(key, "missing (overridden or wrapped by the plugin)")
            continue
        new = node_source(found.text, found.node)
        if new == old:
            report.lines.append(f"  same {key}")
        else:
            diff = _diff(old, new, key, version, pinned)
            report.add(key, "changed (overridden or wrapped)", diff)
    return report


def download(version: str, cache: Path) -> Path:
    """The ``vllm==version`` wheel, downloaded once into ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
            + ["--quiet", "--only-binary=:all:", "-d", str(cache), f"vllm=={version}"],
            check=True,
        )
        wheels = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        raise SystemExit(f"drift: pip downloaded no vllm {version} wheel into {cache}")
    return wheels[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vllm-ppspec-drift", description=__doc__)
    ap.add_argument("version", help="the vLLM release to read, e.g. 0.33.0")
    given = ap.add_mutually_exclusive_group()
    given.add_argument("--wheel", type=Path, help="read this wheel instead of downloading")
    given.add_argument("--source", type=Path, help="read this directory (it holds vllm/)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE / "wheels")
    args = ap.parse_args(argv)
    if args.source is not None:
        sources, origin = Sources.of_dir(args.source), str(args.source)
    else:
        wheel = args.wheel or download(args.version, args.cache)
        sources, origin = Sources.of_wheel(wheel), str(wheel)
    report = check(sources, args.version)
    print(f"vLLM {args.version} ({origin}) against the reference vLLM and this plugin:")
    print("\n".join(report.lines))
    if report.drift:
        print(f"UNEXPLAINED DRIFT: {len(report.drift)}: " + ", ".join(report.drift))
        return 1
    print("NO UNEXPLAINED DRIFT")
    return 0


if __name__ == "__main__":
    sys.exit(main())
