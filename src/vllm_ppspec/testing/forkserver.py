"""A pre-imported Python process that forks one child per engine job.

Importing vLLM, torch and transformers costs about 10 s of CPU in every fresh
interpreter here. Every engine job and every ``vllm serve`` of the tests used
to pay it in its own new interpreter. The fork server imports them once; each
job then runs in a forked child: a process of its own, in a session of its
own, with the caller's environment, that starts from the same pristine
imported state every time (nothing a job does reaches the next one).

vLLM's own processes (``vllm serve``'s engine core, the workers) are forked
too, from the job: vLLM's default start method on Linux, which its CPU
platform replaces with ``spawn`` (``CpuPlatform.check_and_update_config``).
The server wraps that hook so that ``VLLM_WORKER_MULTIPROC_METHOD`` goes back
to ``fork`` afterwards, unless the job's environment has
``PPSPEC_VLLM_START=spawn``: then vLLM spawns fresh interpreters, as for a
user. A spawned worker or engine core costs about 6-12 s of imports here; a
forked one well under 1 s.

Protocol, on the server's stdin / stdout (children run concurrently):

* request: one JSON line ``{"id", "module", "argv", "env", "cwd", "log"}``;
* replies: ``{"id", "pid"}`` once forked, ``{"pid", "returncode"}`` when the
  child has ended (``-signal`` if a signal ended it).

The child redirects its stdin to ``/dev/null`` and stdout / stderr to ``log``,
sets ``os.environ`` to ``env``, calls ``setsid()``, then runs
``module.main()`` with ``sys.argv = argv``.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any

# What every job and every server imports; preloaded once.
PRELOAD = (
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.entrypoints.cli.main",
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.core",
    "vllm.v1.executor.multiproc_executor",
    "vllm_ppspec.testing.run_offline",
)


def _child(request: dict[str, Any], reply_fd: int, request_fd: int) -> None:
    """Run in the forked child: never returns."""
    code = 1
    try:
        os.close(reply_fd)
        os.close(request_fd)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = list(request["argv"])
        try:
            importlib.import_module(request["module"]).main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        # What the interpreter does at exit: multiprocessing joins or
        # terminates the processes it started, vLLM's handlers shut down.
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _let_vllm_fork() -> None:
    """After the CPU platform's config hook, which sets ``spawn``, set ``fork``
    back, unless ``PPSPEC_VLLM_START=spawn`` (read when the hook runs)."""
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        original(cls, vllm_config)
        if os.environ.get("PPSPEC_VLLM_START", "fork") == "fork":
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign, assignment]

    from vllm.v1.executor.multiproc_executor import WorkerProc

    worker_main = WorkerProc.worker_main

    def forked_worker_main(*args: Any, **kwargs: Any) -> None:
        _bind_threads()
        worker_main(*args, **kwargs)

    WorkerProc.worker_main = staticmethod(forked_worker_main)  # type: ignore[method-assign]


def _bind_threads() -> None:
    """In a forked worker, what OpenMP does at a new interpreter's start.

    vLLM's CPU executor sets each worker's ``OMP_NUM_THREADS`` and
    ``OMP_PLACES`` just before starting it (``OMPProcessManager``); OpenMP reads
    them only when it loads, so a forked worker would keep the fork server's
    threads, unbound (at DP=2 x PP=2, eight spinning threads on two cores).
    """
    import torch

    places = os.environ.get("OMP_PLACES", "")
    if places.startswith("{") and places.endswith("}"):
        os.sched_setaffinity(0, {int(c) for c in places[1:-1].split(",")})
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads:
        torch.set_num_threads(int(threads))


def serve() -> None:
    """The server loop: fork on each request, report pids and exit codes."""
    request_fd = os.dup(0)
    reply_fd = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)  # stray prints of the preloaded modules go to stderr
    for name in PRELOAD:
        importlib.import_module(name)
    from vllm_ppspec.plugin import register

    register()  # what vLLM does in each of its processes; idempotent
    _let_vllm_fork()

    def reply(message: dict[str, Any]) -> None:
        os.write(reply_fd, (json.dumps(message) + "\n").encode())

    reply({"ready": os.getpid()})
    buffer = b""
    children = 0
    while True:
        ready, _, _ = select.select([request_fd], [], [], 0.05)
        if ready:
            chunk = os.read(request_fd, 1 << 16)
            if not chunk:
                return  # the client is gone; its children are in their own sessions
            buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(request, reply_fd, request_fd)
            children += 1
            reply({"id": request["id"], "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children -= 1
            reply({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


class ForkServer:
    """The client side: one server process, started on first use, and a thread
    that reads its replies."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pids: dict[int, int] = {}  # request id -> pid
        self._codes: dict[int, int] = {}  # pid -> exit code
        self._next_id = 0
        self._gone = False
        atexit.register(self.close)  # the server goes with the client

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_ppspec.testing.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert proc.stdout is not None
        if not proc.stdout.readline():
            raise RuntimeError("the fork server died while importing vLLM")
        self._proc, self._gone = proc, False
        threading.Thread(target=self._read_replies, args=(proc,), daemon=True).start()
        return proc

    def _read_replies(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            reply = json.loads(line)
            with self._cond:
                if "id" in reply:
                    self._pids[reply["id"]] = reply["pid"]
                else:
                    self._codes[reply["pid"]] = reply["returncode"]
                self._cond.notify_all()
        with self._cond:
            self._gone = True
            self._cond.notify_all()

    def start(self, module: str, argv: list[str], log: str, env: dict[str, str]) -> Job:
        """Fork a child that runs ``module.main()``; returns once it is forked."""
        with self._cond:
            proc = self._ensure()
            assert proc.stdin is not None
            self._next_id += 1
            rid = self._next_id
            request = {"id": rid, "module": module, "argv": argv, "env": env}
            request.update(cwd=os.getcwd(), log=log)
            proc.stdin.write((json.dumps(request) + "\n").encode())
            proc.stdin.flush()
            while rid not in self._pids:
                if self._gone:
                    raise RuntimeError("the fork server is gone")
                self._cond.wait()
            return Job(self, self._pids.pop(rid))

    def returncode(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit code, once it has ended (None after ``timeout``)."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._codes or self._gone, timeout)
            if pid in self._codes:
                return self._codes[pid]
            return -9 if self._gone else None

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


class Job:
    """A forked child, in a session of its own (``pid`` leads it)."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The child's exit code; ``subprocess.TimeoutExpired`` if it runs on."""
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"job {self.pid}", timeout or 0)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the child's whole session, then reap the child."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, 30)


_SERVER = ForkServer()


def start(module: str, argv: list[str], log: str, env: dict[str, str] | None = None) -> Job:
    """Run ``module.main()`` in a child forked from the shared server."""
    return _SERVER.start(module, argv, log, dict(os.environ if env is None else env))


if __name__ == "__main__":
    serve()
