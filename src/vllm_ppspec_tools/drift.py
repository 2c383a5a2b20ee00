"""What changed in a vLLM release for this plugin, read from its sources, not installed.

    vllm-ppspec-drift VERSION [--wheel PATH | --source DIR] [--cache DIR]

(``python -m vllm_ppspec_tools.drift`` runs the same.)

Downloads the ``vllm==VERSION`` wheel without its dependencies (``pip download
--no-deps``, cached under ``--cache``), or reads ``--wheel`` / an unpacked
``--source`` tree, and reports, against the vLLM installed here (which must be
the reference version, ``compat.data.REFERENCE_VLLM_VERSION``):

* every private name in ``compat.guard.PRIVATE_NAMES`` (compat.data's used names
  and the patch registry's targets): present or missing;
* every mirrored function in ``compat.data.MIRRORED_FUNCTIONS``: the source
  hash pinned for VERSION (the reference's pin for a release not supported),
  or changed, with the diff;
* every upstream method the plugin overrides (its runner, worker and scheduler
  classes: found from their MRO) or wraps (``vllm_ppspec.compat.registry.PATCHED_NAMES``):
  the same source as installed, or changed, with the diff.

It prints a verdict first: supported, "not supported: the V1 runner is
removed" (a release without ``vllm/v1/worker/gpu_model_runner.py``, 0.34.0
on), or not supported. On a release without the V1 runner a name in one of the
V1 runner's modules (``drift_data.V1_RUNNER_MODULES``) is explained by the
removal, and it also lists what the plugin would need of Model Runner V2
(``drift_data.V2_RUNNER_NAMES``, docs/on-model-runner-v2.md): present,
with its file and line, or missing (drift).

Exits 1 on any drift that ``drift_data.EXPLAINED_DRIFT[VERSION]`` does not
explain, 0 otherwise. A name reached only at run time (an attribute set on a
function object, such as torch.compile's ``_torchdynamo_orig_callable``) is
reported as such and not counted.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The reader, re-exported: the tests and check() use these names from here.
from vllm_ppspec_tools.drift_sources import Found, Node, Sources, find, node_source

__all__ = ["Found", "Node", "Sources", "check", "find", "main", "node_source", "short_hash"]

DEFAULT_CACHE = Path(os.environ.get("VLLM_PPSPEC_CACHE", Path.home() / ".cache" / "vllm-ppspec"))


def short_hash(source: str) -> str:
    """As ``compat.guard.source_hash``: sha256 of the source, 16 hex digits."""
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
    verdict: str = ""
    lines: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    # Modules gone from the release whose names are explained by that (module -> why).
    removed_modules: dict[str, str] = field(default_factory=dict)

    def add(self, key: str, what: str, diff: str = "") -> None:
        why = self.explained.get(key)
        module = key.split(":")[0]
        if why is None and what.startswith("missing") and module in self.removed_modules:
            why = self.removed_modules[module]
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
    from vllm_ppspec.compat import data, guard, registry
    from vllm_ppspec.compat.no_v1_runner import V1_RUNNER_MODULE
    from vllm_ppspec_tools import drift_data as v2

    pinned = data.REFERENCE_VLLM_VERSION
    if guard.installed_vllm_version() != pinned:
        raise SystemExit(
            f"drift: compares against the reference vLLM {pinned}, installed "
            f"here is {guard.installed_vllm_version()}: run it in the project's .venv"
        )
    report = Report(version, dict(v2.EXPLAINED_DRIFT.get(version, {})))
    v1_removed = sources.module(V1_RUNNER_MODULE) is None
    if version in data.SUPPORTED_VLLM_VERSIONS:
        report.verdict = "supported"
    elif v1_removed:
        report.verdict = "not supported: the V1 runner is removed"
        report.removed_modules = {
            m: v2.REMOVED_WITH_THE_V1_RUNNER
            for m in v2.V1_RUNNER_MODULES
            if sources.module(m) is None
        }
    else:
        report.verdict = f"not supported (the plugin serves {guard.supported_text()})"

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
    targets += [(m, q, installed_source(m, q)) for m, q in registry.PATCHED_NAMES]
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
    if v1_removed:
        check_v2_names(sources, report)
    return report


def check_v2_names(sources: Sources, report: Report) -> None:
    """What the plugin would need of Model Runner V2: each name present, with
    its file and line, or missing (drift)."""
    from vllm_ppspec_tools.drift_data import V2_RUNNER_NAMES as names

    report.lines.append(
        f"what the plugin would need of Model Runner V2 (docs/on-model-runner-v2.md) "
        f"({len(names)}):"
    )
    for module, qualname in names:
        key = f"{module}:{qualname}"
        found = find(sources, module, qualname)
        if found.node is None and not found.other:
            report.add(key, f"missing ({found.missing or 'not a definition'})")
            continue
        line = f" ({where(found)})" if found.node is not None else ""
        report.lines.append(f"  present {key}{line}")


def where(found: Found) -> str:
    """``path.py:line`` of a found definition (its ``def`` or ``class`` line)."""
    assert found.node is not None
    return f"{found.path}:{found.node.lineno}"


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
    print(f"verdict: {report.verdict}")
    print("\n".join(report.lines))
    if report.drift:
        print(f"UNEXPLAINED DRIFT: {len(report.drift)}: " + ", ".join(report.drift))
        return 1
    print("NO UNEXPLAINED DRIFT")
    return 0


if __name__ == "__main__":
    sys.exit(main())
