"""The drift tool (``python -m vllm_ppspec_tools.drift``) reads a vLLM release's
sources and reports the names, mirrors and overridden methods that changed.

Its reference is the installed, pinned vLLM: read against the installed sources
it must find no drift, and every mirror's hash read from source must equal the
one ``version_guard`` computes from the imported function. A planted drift (a
mirrored function edited, a private name renamed, an overridden method edited)
must fail it, naming each, with the diff.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_ppspec.compat import data as version_data
from vllm_ppspec.compat import guard as version_guard
from vllm_ppspec_tools import drift, drift_data


def _installed_root() -> Path:
    import vllm

    return Path(vllm.__file__).resolve().parent.parent


def _recording_sources(root: Path, read: set[str]) -> drift.Sources:
    def reader(path: str) -> str | None:
        file = root / path
        if file.is_file():
            read.add(path)
            return file.read_text()
        return None

    return drift.Sources(reader)


def test_installed_sources_have_no_drift_and_source_hashes_match_the_pins():
    report = drift.check(
        drift.Sources.of_dir(_installed_root()), version_data.REFERENCE_VLLM_VERSION
    )
    assert report.drift == [], "\n".join(report.lines)
    present = [line for line in report.lines if line.startswith("  present ")]
    runtime = [line for line in report.lines if line.startswith("  run time only ")]
    assert len(present) + len(runtime) == len(version_guard.PRIVATE_NAMES)
    assert len(runtime) == 1, runtime  # torch.compile's _torchdynamo_orig_callable
    sources = drift.Sources.of_dir(_installed_root())
    for module, qualname, pins, _ in version_data.MIRRORED_FUNCTIONS:
        found = drift.find(sources, module, qualname)
        assert found.node is not None, (module, qualname)
        static = drift.short_hash(drift.node_source(found.text, found.node))
        pin = pins[version_data.REFERENCE_VLLM_VERSION]
        assert static == pin == version_guard.source_hash(module, qualname), (module, qualname)
    overridden = {f"{m}:{q}" for m, q, _ in drift.overridden()}
    for name in (
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model",
        "vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
        "vllm.v1.core.sched.async_scheduler:AsyncScheduler._update_after_schedule",
    ):
        assert name in overridden, sorted(overridden)


PLANTED = "        pass  # planted drift"
PLANTS = {
    # a mirrored function edited: a statement added at the top of its body
    "vllm/v1/core/sched/scheduler.py": (
        "    ) -> CachedRequestData:\n",
        "    ) -> CachedRequestData:\n" + PLANTED + "\n",
    ),
    # a private name renamed away
    "vllm/v1/worker/gpu_model_runner.py": (
        "def _pp_broadcast_prev_sampled_token_ids(",
        "def _pp_broadcast_prev_sampled_token_ids_gone(",
    ),
    # an overridden method edited
    "vllm/v1/core/sched/async_scheduler.py": (
        "    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:\n",
        "    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:\n"
        + PLANTED
        + "\n",
    ),
}


def test_a_planted_drift_fails_the_tool_naming_each_change_with_its_diff(tmp_path):
    read: set[str] = set()
    drift.check(_recording_sources(_installed_root(), read), version_data.REFERENCE_VLLM_VERSION)
    for path in read:  # only the files the tool reads
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(_installed_root() / path, tmp_path / path)
    for path, (old, new) in PLANTS.items():
        text = (tmp_path / path).read_text()
        assert text.count(old) == 1, (path, old)
        (tmp_path / path).write_text(text.replace(old, new))

    proc = subprocess.run(
        [sys.executable, "-m", "vllm_ppspec_tools.drift", "9.9.9", "--source", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, out + proc.stderr[-3000:]
    assert (
        "DRIFT vllm.v1.core.sched.scheduler:Scheduler._make_cached_request_data: changed" in out
    ), out
    assert "+" + PLANTED in out, out  # the diff
    assert (
        "DRIFT vllm.v1.worker.gpu_model_runner:"
        "GPUModelRunner._pp_broadcast_prev_sampled_token_ids: missing" in out
    ), out
    assert (
        "DRIFT vllm.v1.core.sched.async_scheduler:AsyncScheduler._update_after_schedule: changed"
        in out
    ), out
    assert "UNEXPLAINED DRIFT: " in out


def test_explained_drift_is_listed_and_passes(tmp_path, monkeypatch):
    key = "vllm.v1.core.sched.scheduler:Scheduler._make_cached_request_data"
    text = (_installed_root() / "vllm/v1/core/sched/scheduler.py").read_text()
    old, new = PLANTS["vllm/v1/core/sched/scheduler.py"]

    def read(path: str) -> str | None:
        if path == "vllm/v1/core/sched/scheduler.py":
            return text.replace(old, new)
        file = _installed_root() / path
        return file.read_text() if file.is_file() else None

    monkeypatch.setattr(drift_data, "EXPLAINED_DRIFT", {"9.9.9": {key: "re-read, same logic"}})
    report = drift.check(drift.Sources(read), "9.9.9")
    assert report.drift == [], report.drift
    assert any(f"explained {key}" in line for line in report.lines), report.lines


def test_the_tool_refuses_to_run_against_another_installed_vllm(monkeypatch):
    monkeypatch.setattr(version_guard, "installed_vllm_version", lambda: "0.31.0")
    with pytest.raises(SystemExit, match="compares against the reference vLLM 0.32.0"):
        drift.check(drift.Sources.of_dir(_installed_root()), "0.33.0")


# A release without the V1 runner (0.34.0 on), made from the installed sources
# by hiding the V1 runner's modules. Its cpu_worker.py is still 0.32.0's, which
# imports the hidden CPU runner: explained here, as 0.34.0's own does not.
CPU_WORKER_IMPORT = "vllm.v1.worker.cpu_worker:CPUModelRunner"


def _without_the_v1_runner() -> drift.Sources:
    from vllm_ppspec_tools import drift_data as v2_runner_data

    hidden = {m.replace(".", "/") + ".py" for m in v2_runner_data.V1_RUNNER_MODULES}

    def read(path: str) -> str | None:
        file = _installed_root() / path
        return None if path in hidden or not file.is_file() else file.read_text()

    return drift.Sources(read)


def test_a_release_without_the_v1_runner_is_not_supported_and_lists_the_v2_names(monkeypatch):
    from vllm_ppspec_tools import drift_data as v2_runner_data

    why = "0.32.0's cpu_worker.py imports the hidden CPU runner"
    monkeypatch.setattr(drift_data, "EXPLAINED_DRIFT", {"9.9.9": {CPU_WORKER_IMPORT: why}})
    report = drift.check(_without_the_v1_runner(), "9.9.9")
    assert report.verdict == "not supported: the V1 runner is removed"
    # The only drift left: V2 names the installed vLLM lacks (imported to see).
    absent = [f"{m}:{q}" for m, q in v2_runner_data.V2_RUNNER_NAMES if not _defined(m, q)]
    assert report.drift == absent, report.drift
    removed = [line for line in report.lines if "removed with the V1 runner" in line]
    assert any("GPUModelRunner._pp_broadcast_prev_sampled_token_ids: missing" in r for r in removed)
    header = "what the plugin would need of Model Runner V2"
    start = next(i for i, line in enumerate(report.lines) if line.startswith(header))
    listed = report.lines[start + 1 :]
    assert len(listed) == len(v2_runner_data.V2_RUNNER_NAMES)
    for (module, qualname), line in zip(v2_runner_data.V2_RUNNER_NAMES, listed, strict=True):
        key = f"{module}:{qualname}"
        want = f"  present {key}" if key not in absent else f"  DRIFT {key}: missing"
        assert line.startswith(want), line
    execute = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model"
    assert any(
        line.startswith(f"  present {execute} (vllm/v1/worker/gpu/model_runner.py:")
        for line in listed
    ), listed


def _defined(module: str, qualname: str) -> bool:
    import importlib

    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def test_a_missing_v2_name_is_unexplained_drift(monkeypatch):
    from vllm_ppspec_tools import drift_data as v2_runner_data

    gone = ("vllm.v1.worker.gpu.pp_utils", "PPHandler.no_such_method")
    monkeypatch.setattr(v2_runner_data, "V2_RUNNER_NAMES", v2_runner_data.V2_RUNNER_NAMES + (gone,))
    explained = {"9.9.9": {CPU_WORKER_IMPORT: "as above"}}
    monkeypatch.setattr(drift_data, "EXPLAINED_DRIFT", explained)
    report = drift.check(_without_the_v1_runner(), "9.9.9")
    assert "vllm.v1.worker.gpu.pp_utils:PPHandler.no_such_method" in report.drift, report.drift
    assert "  DRIFT vllm.v1.worker.gpu.pp_utils:PPHandler.no_such_method: missing" in "\n".join(
        report.lines
    )


def test_a_supported_release_gets_its_verdict():
    report = drift.check(
        drift.Sources.of_dir(_installed_root()), version_data.REFERENCE_VLLM_VERSION
    )
    assert report.verdict == "supported"
    assert not any(line.startswith("what the plugin would need") for line in report.lines)
