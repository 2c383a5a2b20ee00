"""``vllm serve`` as a child process: start, wait until ready, read ``/metrics``, stop.

Each server runs in its own process session and is killed with everything it
spawned (API server, engine core, one worker per rank).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_ppspec import WORKER_QUALNAME


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``vllm serve`` in its own session; killed with everything it spawned."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"serve-{name}.log"
        vllm_cli = Path(sys.executable).parent / "vllm"
        cmd = [str(vllm_cli), "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        print(f"$ {' '.join(cmd)}", flush=True)
        self.log = open(self.log_path, "w")
        self.proc: Any
        if os.environ.get("PPSPEC_FORKSERVER", "1") != "0":
            # The same command, in a child of the fork server (vLLM imported
            # already); its engine core and workers are spawned as usual.
            from vllm_ppspec.testing import forkserver

            module = "vllm.entrypoints.cli.main"
            self.proc = forkserver.start(module, cmd, str(self.log_path), {**os.environ, **env})
        else:
            self.proc = subprocess.Popen(
                cmd,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 600) -> float:
        """Seconds until ``/v1/models`` answers; on failure the server is stopped, then raised."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(
                    f"vllm serve exited with {self.proc.returncode}; log: {self.log_path}\n"
                    + self.log_path.read_text()[-4000:]
                )
            try:
                with urllib.request.urlopen(self.base + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"vllm serve not ready after {timeout}s; log: {self.log_path}")

    def wait_for_log(self, done: Callable[[str], bool], timeout: float) -> str:
        """The server's log once ``done(log)`` holds, or after ``timeout`` seconds
        (the caller asserts). Its processes write their lines independently: one
        may reach the log after a client has already seen the event."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.log_path.read_text()
            if done(log) or time.monotonic() > deadline:
                return log
            time.sleep(0.02)

    def metrics(self) -> dict[str, float]:
        """Every metric on ``/metrics``, summed over its label sets."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name = line.split("{")[0].split(" ")[0]
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()


def serve_args(model: str, name: str, max_model_len: int, *extra: str) -> list[str]:
    """``vllm serve`` arguments shared by the demo, the soak and the fault tests."""
    return [
        model,
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--served-model-name",
        name,
        *extra,
    ]


def pp_spec_args(pp: int, spec: dict[str, Any], async_scheduling: bool = False) -> list[str]:
    """PP + speculative decoding with the plugin's worker (mp executor)."""
    return [
        "--pipeline-parallel-size",
        str(pp),
        "--distributed-executor-backend",
        "mp",
        "--speculative-config",
        json.dumps(spec),
        "--worker-cls",
        WORKER_QUALNAME,
        *(["--async-scheduling"] if async_scheduling else []),
    ]
