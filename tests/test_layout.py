"""The package layout (docs/design.md, "Layout"):

- the plugin (``src/vllm_ppspec``) never imports the tools or fixtures
  (``src/vllm_ppspec_tools``), neither at import time nor anywhere in its source;
- the tools and ``scripts/`` never import ``tests/`` (shared harness code lives
  in ``vllm_ppspec_tools``);
- the protocol imports no vLLM;
- no module of the plugin is over 300 lines, nor of the tools over 400;
- the plugin's folders import each other without a loop (module level: each
  folder without subfolders one node, e.g. ``runner/steps/``; each module of a
  folder with subfolders, the package root or ``runner/``, one node of its own);
- the tools are console scripts (``vllm-ppspec-<tool>``), each also
  ``python -m vllm_ppspec_tools.<tool>``, and the plugin carries no shims for them;
- the public names users type keep their paths.

The import checks read the source (``ast``): every ``import`` counts, also those
inside functions.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
PLUGIN = SRC / "vllm_ppspec"
TOOLS_PKG = SRC / "vllm_ppspec_tools"
MAX_LINES = 300  # a module of the plugin
MAX_TOOL_LINES = 400  # a module of the tools
# The tools with a main(), and their console scripts.
TOOLS = {
    "demo": "vllm-ppspec-demo",
    "bench": "vllm-ppspec-bench",
    "bench_serve": "vllm-ppspec-bench-serve",
    "soak": "vllm-ppspec-soak",
    "transport_bench": "vllm-ppspec-transport-bench",
    "async_cpu_bench": "vllm-ppspec-async-cpu-bench",
    "drift": "vllm-ppspec-drift",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path) -> dict[str, Path]:
    """Every module under ``root`` (a package in ``src/``), by dotted name."""
    return {_module_name(p): p for p in sorted(root.rglob("*.py"))}


def _imports(path: Path, package: str | None = None) -> set[str]:
    """The dotted names ``path`` imports: ``import a.b`` gives a.b; ``from a.b
    import c`` gives a.b and a.b.c (c may be a module); relative imports resolved
    against ``package``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert package is not None, f"{path}: a relative import outside a package"
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports_of(path: Path) -> set[str]:
    return _imports(path, _package_of(path) if path.is_relative_to(SRC) else None)


def _under(name: str, top: str) -> bool:
    return name == top or name.startswith(top + ".")


# ---------------------------------------------------------------------------
# Who imports whom.
# ---------------------------------------------------------------------------


def _import_at_runtime(modules: list[str]) -> set[str]:
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print('\\n'.join(sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(out.stdout.split())


def test_the_plugin_never_imports_the_tools_or_fixtures():
    """Every module of the plugin imported, in a fresh interpreter: no tool came with them."""
    modules = sorted(_modules(PLUGIN))
    loaded = _import_at_runtime(modules)
    assert set(modules) <= loaded
    assert not [m for m in loaded if _under(m, "vllm_ppspec_tools")]


def test_no_plugin_module_imports_the_tools_in_its_source():
    found = {
        name: sorted(m for m in _imports_of(path) if _under(m, "vllm_ppspec_tools"))
        for name, path in _modules(PLUGIN).items()
    }
    assert not {name: m for name, m in found.items() if m}


def _script_files() -> list[Path]:
    return sorted((REPO / "scripts").glob("*.py"))


# A module run by name, e.g. [sys.executable, "-m", "tests.node_init"].
TESTS_BY_NAME = re.compile(r"^tests(\.\w+)+$")


def _tests_used(path: Path) -> list[str]:
    used = sorted(m for m in _imports_of(path) if _under(m, "tests"))
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if TESTS_BY_NAME.match(node.value):
                used.append(f"{node.value!r} (run by name)")
    return used


def test_no_tool_or_script_imports_the_tests():
    """The tools and scripts/ stand without tests/: what they share with the tests
    lives in vllm_ppspec_tools (fixtures/, hosts/)."""
    files = [*_modules(TOOLS_PKG).values(), *_script_files()]
    assert len(files) > 10
    found = {str(p.relative_to(REPO)): _tests_used(p) for p in files}
    assert not {p: used for p, used in found.items() if used}
    for sh in sorted((REPO / "scripts").glob("*.sh")):
        assert not re.search(r"-m\s+tests\.", sh.read_text()), sh


def test_the_protocol_imports_no_vllm():
    modules = sorted(m for m in _modules(PLUGIN) if _under(m, "vllm_ppspec.protocol"))
    assert len(modules) > 1
    loaded = _import_at_runtime(modules)
    assert not [m for m in loaded if _under(m, "vllm")]
    for name in modules:
        path = _modules(PLUGIN)[name]
        assert not [m for m in _imports_of(path) if _under(m, "vllm")], name


# ---------------------------------------------------------------------------
# Size and shape.
# ---------------------------------------------------------------------------


def _sizes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in root.rglob("*.py")}


def test_no_module_of_the_plugin_is_over_300_lines():
    sizes = _sizes(PLUGIN)
    assert len(sizes) > 20
    assert not {p: n for p, n in sizes.items() if n > MAX_LINES}


def test_no_module_of_the_tools_is_over_400_lines():
    sizes = _sizes(TOOLS_PKG)
    assert len(sizes) > 20
    assert not {p: n for p, n in sizes.items() if n > MAX_TOOL_LINES}


def _has_subfolders(folder: Path) -> bool:
    return any((d / "__init__.py").is_file() for d in folder.iterdir() if d.is_dir())


def _node_of(module: str) -> str | None:
    """The graph node of a plugin module: its folder (``runner/steps/``) if that
    folder has no subfolders; else, in a folder with subfolders (the package
    root, ``runner/``), the module itself (``plugin.py``, ``runner/mixin.py``,
    ``runner/__init__.py``). A name imported from a module (``from a import
    name``) counts as that module; None outside the plugin."""
    parts = module.split(".")
    if parts[0] != "vllm_ppspec":
        return None
    folder, rel = PLUGIN, ""
    for part in parts[1:]:
        if (folder / part / "__init__.py").is_file():
            folder, rel = folder / part, f"{rel}{part}/"
        elif (folder / f"{part}.py").is_file():
            return f"{rel}{part}.py" if _has_subfolders(folder) else rel
        else:
            break  # a name defined in the folder's __init__.py
    return f"{rel}__init__.py" if _has_subfolders(folder) else rel


def folder_graph() -> dict[str, dict[str, list[str]]]:
    """node -> node it imports -> the imports that make the arrow
    ("workers/cpu.py: vllm_ppspec.patches.install_group")."""
    graph: dict[str, dict[str, list[str]]] = {}
    for name, path in _modules(PLUGIN).items():
        source = _node_of(name)
        assert source is not None, name
        graph.setdefault(source, {})
        for imported in sorted(_imports_of(path)):
            target = _node_of(imported)
            if target is not None and target != source:
                why = f"{path.relative_to(PLUGIN)}: {imported}"
                graph[source].setdefault(target, []).append(why)
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_loop():
    graph = {"a/": {"b/": []}, "b/": {"c.py": []}, "c.py": {"a/": []}, "d/": {"a/": []}}
    assert cycles(graph) == [["a/", "b/", "c.py"]]
    assert cycles({"a/": {"b/": []}, "b/": {}}) == []


def test_each_subfolder_is_a_node():
    """runner/'s subfolders are nodes of their own; runner/'s own modules, like
    the package root's, are one node each."""
    assert _node_of("vllm_ppspec.runner.steps.lanes.LaneSender") == "runner/steps/"
    assert _node_of("vllm_ppspec.runner.steps") == "runner/steps/"
    assert _node_of("vllm_ppspec.runner.health.peer_watch") == "runner/health/"
    assert _node_of("vllm_ppspec.runner.mixin.PPSpecRunnerMixin") == "runner/mixin.py"
    assert _node_of("vllm_ppspec.runner") == "runner/__init__.py"
    assert _node_of("vllm_ppspec.sched.lanes") == "sched/"
    assert _node_of("vllm_ppspec.patches.config.stop_grace") == "patches/config/"
    assert _node_of("vllm_ppspec.patches.install_group") == "patches/__init__.py"
    assert _node_of("vllm_ppspec.compat.registry.REGISTRY") == "compat/"
    assert _node_of("vllm_ppspec.choice.plan.plan_of") == "choice/"
    assert _node_of("vllm_ppspec.adaptive_k.chooser") == "adaptive_k/"
    assert _node_of("vllm_ppspec.workers.cpu") == "workers/"
    assert _node_of("vllm_ppspec.plugin.register") == "plugin.py"
    assert _node_of("vllm_ppspec.WORKER_QUALNAME") == "__init__.py"
    assert _node_of("vllm_ppspec") == "__init__.py"
    assert _node_of("vllm.config") is None


def test_the_plugin_folders_have_no_import_loop():
    """Folder A -> folder B when a module in A imports one in B (each module of
    a folder with subfolders a node of its own: _node_of). A loop means some
    arrow points up: the message names every arrow inside each loop and the
    imports that make it."""
    graph = folder_graph()
    assert {"protocol/", "sched/", "workers/", "runner/mixin.py", "runner/view.py"} <= set(graph)
    assert {f"runner/{f}/" for f in ("steps", "drafter", "health")} <= set(graph)
    assert {f"patches/{f}/" for f in ("config", "engine_core", "worker")} <= set(graph)
    assert {"patches/__init__.py", "patches/install_state.py"} <= set(graph)
    assert {"compat/", "choice/", "adaptive_k/"} <= set(graph)
    found = cycles(graph)
    report = []
    for component in found:
        for a in component:
            for b, why in graph[a].items():
                if b in component:
                    report.append(f"{a} -> {b}: " + "; ".join(why))
    assert not found, "import loops between the plugin's folders:\n" + "\n".join(report)


# The plugin's layers, lowest first: a module imports only from its own layer
# or a lower one (design.md, "Layout"). Every node is in one (by prefix).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "decisions and data",
        (
            "__init__.py",  # the public names
            "compat/",  # what of vLLM the plugin uses and changes, per release
            "choice/",  # who serves, the plan, the layer split
            "adaptive_k/",  # K by batch size
            "protocol/",  # what the ranks exchange (no vLLM)
        ),
    ),
    ("patches", ("patches/",)),
    ("engine core and workers", ("sched/", "runner/", "workers/")),
    ("entry points", ("plugin.py", "worker.py", "scheduler.py")),
)


def layer_of(node: str) -> int:
    found = [i for i, (_, prefixes) in enumerate(LAYERS) if node.startswith(prefixes)]
    assert len(found) == 1, f"{node}: in {len(found)} layers; give it one in LAYERS"
    return found[0]


def test_the_root_holds_only_the_entry_points_and_the_public_names():
    """Every other module sits in a folder named by its role."""
    assert sorted(p.name for p in PLUGIN.glob("*.py")) == [
        "__init__.py",
        "plugin.py",
        "scheduler.py",
        "worker.py",
    ]


def test_the_schedulers_import_no_patch():
    """``sched/`` reads the plan, the policy and adaptive K below it; nothing in
    ``patches/`` (an arrow from the engine core's side into a patch)."""
    graph = folder_graph()
    assert "sched/" in graph
    into = {b: why for b, why in graph["sched/"].items() if b.startswith("patches/")}
    assert not into, into


def test_no_import_points_up_a_layer():
    """The hook and the public names at the top, the engine core's and the
    workers' sides under them, the patches under those, the pure modules at
    the bottom: no arrow up (the workers ask patches/install_state, not the
    hook, whether the patches are in)."""
    up = [
        f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]}): " + "; ".join(why)
        for a, targets in folder_graph().items()
        for b, why in targets.items()
        if layer_of(b) > layer_of(a)
    ]
    assert not up, "imports up a layer:\n" + "\n".join(up)


# ---------------------------------------------------------------------------
# The tools as commands, and the public names.
# ---------------------------------------------------------------------------


def test_the_tools_are_console_scripts():
    """pyproject's [project.scripts]: vllm-ppspec-<tool> -> vllm_ppspec_tools.<tool>:main."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {cmd: f"vllm_ppspec_tools.{tool}:main" for tool, cmd in TOOLS.items()}
    for tool in TOOLS:
        tree = ast.parse((TOOLS_PKG / f"{tool}.py").read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), tool


def test_the_plugin_carries_no_tool_shims():
    assert not [t for t in TOOLS if (PLUGIN / f"{t}.py").exists()]


@pytest.mark.parametrize("tool", list(TOOLS))
def test_python_m_tool_commands_keep_working(tool):
    """``python -m vllm_ppspec_tools.<tool>`` runs the tool (its --help here);
    the console script calls the same main()."""
    out = subprocess.run(
        [sys.executable, "-m", f"vllm_ppspec_tools.{tool}", "--help"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "usage:" in out.stdout


def test_public_names_keep_their_paths():
    from vllm_ppspec.sched.filled import PPSpecScheduler
    from vllm_ppspec.scheduler import PPSpecScheduler as public

    assert public is PPSpecScheduler
    from vllm_ppspec import WORKER_QUALNAME
    from vllm_ppspec.worker import PPSpecWorker

    assert WORKER_QUALNAME == "vllm_ppspec.worker.PPSpecWorker" and PPSpecWorker


# The runner's per-step path: the mixin's overrides vLLM calls every step, and
# every method of the steps' classes (runner/steps/), set-up aside.
PER_STEP_OVERRIDES = (
    "execute_model",
    "sample_tokens",
    "_update_states",
    "_update_states_after_model_execute",
    "_pp_broadcast_prev_sampled_token_ids",
    "_build_attention_metadata",
    "_model_forward",
)
RANK_OR_MODE = re.compile(
    r"is_last|last_rank|rank_in_group|pp_rank|is_first|ppspec_plan|serves_pp|\bMode\b|\.mode\b"
)


def _conditions(func: ast.AST) -> list[str]:
    """The source of every condition in ``func``: if, while, conditional expression."""
    return [
        ast.unparse(node.test)
        for node in ast.walk(func)
        if isinstance(node, (ast.If, ast.While, ast.IfExp))
    ]


def test_no_rank_or_mode_branch_in_the_per_step_path():
    """The rank and the mode are decided once, when the steps are built
    (runner/steps/build.py): the per-step path only calls hooks."""
    mixin = ast.parse((PLUGIN / "runner" / "mixin.py").read_text())
    per_step: list[tuple[str, ast.AST]] = [
        (f"mixin.{f.name}", f)
        for f in ast.walk(mixin)
        if isinstance(f, ast.FunctionDef) and f.name in PER_STEP_OVERRIDES
    ]
    assert {name.split(".")[1] for name, _ in per_step} == set(PER_STEP_OVERRIDES)
    for path in sorted((PLUGIN / "runner" / "steps").glob("*.py")):
        if path.name == "build.py":  # set-up: where the branches belong
            continue
        for cls in (n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)):
            per_step += [
                (f"{path.stem}.{cls.name}.{f.name}", f)
                for f in cls.body
                if isinstance(f, ast.FunctionDef) and f.name != "__init__"
            ]
    found = [
        (name, cond) for name, func in per_step for cond in _conditions(func)
        if RANK_OR_MODE.search(cond)
    ]  # fmt: skip
    assert not found, f"rank or mode branches on the per-step path: {found}"


def test_the_branch_check_sees_a_rank_branch():
    func = ast.parse("def f(self):\n    if self.is_last:\n        pass\n").body[0]
    assert any(RANK_OR_MODE.search(c) for c in _conditions(func))
