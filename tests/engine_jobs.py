"""Run real vLLM engines (offline LLM) in fresh processes for the end-to-end tests."""

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

# Prompts of different lengths, requests finishing at different steps, and a
# prompt longer than the token budget (chunked prefill with
# max_num_batched_tokens=64). The max_tokens values are not multiples of k+1,
# so requests end inside a speculative round.
GREEDY_REQUESTS: list[dict[str, Any]] = [
    {"prompt_token_ids": [5, 6, 7, 8, 9], "max_tokens": 37},
    {"prompt_token_ids": [30, 31, 32], "max_tokens": 13},
    {"prompt_token_ids": [100 + (7 * i) % 300 for i in range(23)], "max_tokens": 29},
    {"prompt_token_ids": [3 + (11 * i) % 500 for i in range(150)], "max_tokens": 21},
    {"prompt_token_ids": [444], "max_tokens": 6},
    {"prompt_token_ids": [17, 300, 42, 42, 17, 300], "max_tokens": 48},
]
TOKEN_BUDGET = 64

SAMPLED_REQUESTS: list[dict[str, Any]] = [
    {"prompt_token_ids": [12, 13, 14], "max_tokens": 25, "temperature": 1.0, "seed": 7},
    {"prompt_token_ids": [200, 201], "max_tokens": 19, "temperature": 1.0, "seed": 8},
]


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
        with open(log_path, "w") as log_file:
            # A new session, so that the engine core and workers vLLM spawns
            # can be killed with it, whatever state they are in.
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vllm_ppspec.testing.run_offline",
                    str(job_path),
                    str(out_path),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=timeout)
                note = ""
            except subprocess.TimeoutExpired:
                code, note = -9, f"\nTIMEOUT after {timeout}s"
            finally:
                kill_session(proc.pid)
        log = log_path.read_text(errors="replace") + note
        result = json.loads(out_path.read_text()) if out_path.exists() else None
        return JobResult(code, result, log)


def kill_session(pid: int) -> None:
    """Kill every process left in the session led by ``pid``."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def job(
    model: str,
    pp: int = 1,
    spec: dict[str, Any] | None = None,
    *,
    async_scheduling: bool | None = None,
    worker: str = "ppspec",
    requests: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "model": model,
        "pp": pp,
        "spec": spec,
        "async_scheduling": async_scheduling,
        "worker": worker,
        "max_num_batched_tokens": TOKEN_BUDGET,
        "requests": requests if requests is not None else GREEDY_REQUESTS,
        **extra,
    }
