"""Run one offline vLLM engine job (``run_offline``) in a process session of its own.

The job's process is forked from the shared fork server (``forkserver``), which
has vLLM imported already; ``PPSPEC_FORKSERVER=0`` starts a new interpreter
per job instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class JobResult:
    returncode: int
    result: dict[str, Any] | None
    log: str

    @property
    def outputs(self) -> list[list[int]]:
        assert self.result is not None, self.log[-6000:]
        return self.result["outputs"]


def run_job(job: dict[str, Any], timeout: float = 600) -> JobResult:
    with tempfile.TemporaryDirectory() as d:
        job_path = Path(d) / "job.json"
        out_path = Path(d) / "out.json"
        job_path.write_text(json.dumps(job))
        log_path = Path(d) / "log.txt"
        log_path.touch()
        argv = ["run_offline", str(job_path), str(out_path)]
        if os.environ.get("PPSPEC_FORKSERVER", "1") != "0":
            from vllm_ppspec.testing import forkserver

            child = forkserver.start("vllm_ppspec.testing.run_offline", argv, str(log_path))
            code, note = _wait(child, timeout, child.kill)
        else:
            with open(log_path, "w") as log_file:
                # A new session, so that the engine core and workers vLLM spawns
                # can be killed with it, whatever state they are in.
                proc = subprocess.Popen(
                    [sys.executable, "-m", "vllm_ppspec.testing.run_offline", *argv[1:]],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                code, note = _wait(proc, timeout, lambda: kill_session(proc.pid))
        return _result(code, log_path, out_path, note)


def _wait(proc: Any, timeout: float, kill: Any) -> tuple[int, str]:
    """The job's exit code (-9 after ``timeout``) and a note for its log; then
    ``kill()`` ends whatever is left of its session (engine core, workers)."""
    try:
        return proc.wait(timeout=timeout), ""
    except subprocess.TimeoutExpired:
        return -9, f"\nTIMEOUT after {timeout}s"
    finally:
        kill()


def _result(code: int, log_path: Path, out_path: Path, note: str) -> JobResult:
    log = log_path.read_text(errors="replace") + note
    result = json.loads(out_path.read_text()) if out_path.exists() else None
    return JobResult(code, result, log)


def kill_session(pid: int) -> None:
    """Kill every process left in the session led by ``pid``."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
