"""The patch registry (vllm_ppspec.compat.registry.REGISTRY) names what the plugin changes."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from vllm_ppspec.compat import guard as version_guard
from vllm_ppspec.compat.patch import Patch
from vllm_ppspec.compat.registry import REGISTRY


def test_the_patched_names_are_the_config_entries_and_install_wraps_each():
    from vllm_ppspec.compat.registry import PATCHED_NAMES
    from vllm_ppspec.plugin import register

    registered = {t for p in REGISTRY if p.when == "config" for t in p.targets}
    assert {f"{module}:{qualname}" for module, qualname in PATCHED_NAMES} == registered
    register()
    for module, qualname in PATCHED_NAMES:
        owner: object = importlib.import_module(module)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        attr = owner.__dict__[name]  # type: ignore[attr-defined]
        func = getattr(attr, "fget", None) or getattr(attr, "__func__", None) or attr
        assert hasattr(func, "__wrapped__"), f"{module}:{qualname} is not wrapped"


def test_every_instance_wrap_of_the_runner_is_registered():
    """The drafter scope's and the DP hook's wraps on the drafter instance."""
    from vllm_ppspec.runner.drafter.scope import DRAFTER_MODEL_METHODS

    base = "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer."
    scope = {
        t for p in REGISTRY if p.module == "vllm_ppspec.runner.drafter.scope" for t in p.targets
    }
    for name in (*DRAFTER_MODEL_METHODS, "_create_draft_vllm_config"):
        assert base + name in scope, name
    hook = {
        t for p in REGISTRY if p.module == "vllm_ppspec.runner.drafter.dp_hook" for t in p.targets
    }
    for name in ("propose", "dummy_run", "_determine_batch_execution_and_padding"):
        assert base + name in hook, name


def test_every_patch_names_its_module_an_existing_target_and_an_end():
    for patch in REGISTRY:
        importlib.import_module(patch.module)
        assert patch.when in ("config", "worker", "engine core", "runner"), patch
        assert patch.versions and set(patch.versions) <= set(version_guard.SUPPORTED_VLLM_VERSIONS)
        assert patch.why and patch.how and patch.upstream and patch.remove_when, patch
        for target in patch.targets:
            module, qualname = target.split(":")
            obj: object = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)  # raises if vLLM no longer has it


# ---------------------------------------------------------------------------
# Code -> registry: every change to a vLLM object the code makes is registered.
# ---------------------------------------------------------------------------

PLUGIN = Path(__file__).resolve().parent.parent / "src" / "vllm_ppspec"
# Not patches: the plugin hook puts back the registered config names after a
# failed install (plugin._restore, a setattr / delattr by computed name).
NOT_PATCHES = {("vllm_ppspec.plugin", "*"): "the undo of PATCHED_NAMES"}


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _depth(node: ast.expr) -> int:
    n = 0
    while isinstance(node, ast.Attribute):
        node, n = node.value, n + 1
    return n


def changes_to_vllm(source: str) -> list[tuple[int, str, str]]:
    """(line, kind, attribute) of every change to a vLLM object in ``source``:

    * ``patch``: an attribute stored, deleted or set (``setattr`` / ``delattr``)
      on a name bound by a vLLM import (a module's global, a class's attribute);
    * ``setattr``: ``setattr`` / ``delattr`` on anything but ``self`` (the
      monkeypatch call: a computed name, ``*`` if not a module constant);
    * ``wrap``: an attribute of another object than ``self`` / ``cls`` set to a
      function this module defines, or to what one of its wrapper factories (a
      function defining a function) returns: a method replaced on an instance;
    * ``deep``: an attribute stored two objects past its root or further
      (``runner.drafter.model.embed``): inside an object the plugin does not own.
    """
    tree = ast.parse(source)
    vllm_names: set[str] = set()
    functions: set[str] = set()
    factories: set[str] = set()  # functions that define a function (wrapper factories)
    constants: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            vllm_names |= {
                (a.asname or a.name).split(".")[0] for a in node.names if _is_vllm(a.name)
            }
        elif isinstance(node, ast.ImportFrom) and _is_vllm(node.module or ""):
            vllm_names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.add(node.name)
            if any(
                isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))
                for stmt in node.body
                for inner in ast.walk(stmt)
            ):
                factories.add(node.name)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Name) and isinstance(node.value.value, str):
                    constants[t.id] = node.value.value
    found: list[tuple[int, str, str]] = []

    def is_self(e: ast.expr) -> bool:
        return isinstance(e, ast.Name) and e.id in ("self", "cls")

    def rooted_in_vllm(e: ast.expr) -> bool:
        root = _root(e)
        return isinstance(root, ast.Name) and root.id in vllm_names

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("setattr", "delattr") and node.args:
                obj, name = node.args[0], node.args[1]
                attr = (
                    name.value
                    if isinstance(name, ast.Constant)
                    else constants.get(name.id, "*")
                    if isinstance(name, ast.Name)
                    else "*"
                )
                if rooted_in_vllm(obj):
                    found.append((node.lineno, "patch", attr))
                elif not is_self(obj):
                    found.append((node.lineno, "setattr", attr))
            continue
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Delete):
            targets, value = node.targets, None
        else:
            continue
        for target in targets:
            for t in ast.walk(target):
                if not isinstance(t, ast.Attribute) or isinstance(t.ctx, ast.Load):
                    continue
                if rooted_in_vllm(t.value):
                    found.append((node.lineno, "patch", t.attr))
                elif _depth(t) >= 3:
                    found.append((node.lineno, "deep", t.attr))
                elif not is_self(t.value) and _is_function_of(value, functions, factories):
                    found.append((node.lineno, "wrap", t.attr))
    return found


def _is_vllm(module: str) -> bool:
    return module == "vllm" or module.startswith("vllm.")


def _is_function_of(value: ast.expr | None, functions: set[str], factories: set[str]) -> bool:
    """A function defined in the module, or what a wrapper factory of it returns."""
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.Name):
        return value.id in functions
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and (value.func.id in factories)
    )


def _registered(registry: tuple[Patch, ...]) -> dict[str, set[str]]:
    """module -> the attribute names its entries change (targets, attributes)."""
    names: dict[str, set[str]] = {}
    for patch in registry:
        for name in (*(t.split(":")[1] for t in patch.targets), *patch.attributes):
            names.setdefault(patch.module, set()).add(name.rsplit(".", 1)[-1])
    return names


def unregistered_changes(registry: tuple[Patch, ...]) -> list[str]:
    names = _registered(registry)
    out = []
    for path in sorted(PLUGIN.rglob("*.py")):
        parts = list(path.relative_to(PLUGIN.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        module = ".".join(parts)
        for line, kind, attr in changes_to_vllm(path.read_text()):
            if (module, "*") in NOT_PATCHES:
                continue
            known = names.get(module, set())
            if attr in known or (attr == "*" and known):
                continue
            out.append(f"{path.relative_to(PLUGIN)}:{line}: {kind} {attr}")
    return out


def test_the_code_scan_finds_every_kind_of_change():
    source = (
        "import vllm.x as vx\nfrom vllm.y import Y\nFLAG = '_mark'\n"
        "def wrap(f):\n    def w():\n        return f()\n    return w\n"
        "def plain(x):\n    return x\n"
        "def f(self, obj, runner):\n"
        "    vx.name = 1\n    Y.method = wrap(Y.method)\n    setattr(Y, FLAG, True)\n"
        "    setattr(obj, 'tag', 1)\n    obj.run = wrap(obj.run)\n"
        "    runner.a.b.embed = 2\n"
        "    self.x = wrap(1)\n    obj.count = plain(3)\n    setattr(self, 'y', 1)\n"
    )
    assert sorted((kind, attr) for _, kind, attr in changes_to_vllm(source)) == sorted(
        [
            ("patch", "name"),
            ("patch", "method"),
            ("patch", "_mark"),
            ("setattr", "tag"),
            ("wrap", "run"),
            ("deep", "embed"),
        ]
    )


def test_every_change_to_a_vllm_object_is_registered():
    """The scan of the plugin's code (changes_to_vllm) finds no change that no
    registry entry of that module lists (a target's or an attribute's name)."""
    assert not unregistered_changes(REGISTRY)


def test_an_unregistered_change_fails_the_scan():
    """Without draft_delivery's entry, its setattrs on the runner output are unregistered."""
    without = tuple(p for p in REGISTRY if p.module != "vllm_ppspec.sched.draft_delivery")
    assert unregistered_changes(without) == [
        "sched/draft_delivery.py:32: setattr ppspec_draft_token_ids",
        "sched/draft_delivery.py:34: setattr ppspec_placeholder_drafts",
    ]
