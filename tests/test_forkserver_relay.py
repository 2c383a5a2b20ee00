"""A tool run as a subprocess of a test session forks its processes from the
session's fork server (fixtures/forkserver_relay.py), not from one of its own.

The session's fork server is a stand-in here that runs each requested module
with ``python -m`` and records the request; a real one imports vLLM (10 s).
The client is the tools' own ``forkserver.start``, in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from vllm_ppspec_tools.fixtures import forkserver_relay


class StandInServer:
    def __init__(self) -> None:
        self.requests: list[dict] = []

    def start(self, module, argv, log, env, cwd):
        self.requests.append({"module": module, "argv": argv, "env": env, "cwd": cwd})
        with open(log, "w") as out:
            return subprocess.Popen(
                [sys.executable, "-m", module, *argv[1:]], stdout=out, stderr=out, cwd=cwd
            )


CLIENT = textwrap.dedent(
    """
    import sys
    from vllm_ppspec_tools.fixtures import forkserver

    for module in sys.argv[2:]:
        job = forkserver.start(module, [module], sys.argv[1] + "." + module)
        print(module, job.wait(60))
    """
)


def _client(tmp_path, env_value: str, *modules: str) -> subprocess.CompletedProcess:
    env = {**os.environ, forkserver_relay.ENV: env_value, "RELAY_MARK": "from-the-tool"}
    return subprocess.run(
        [sys.executable, "-c", CLIENT, str(tmp_path / "log"), *modules],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_tools_jobs_are_forked_by_the_sessions_server_with_their_exit_codes(tmp_path):
    server = StandInServer()
    path = str(tmp_path / "relay.sock")
    sock = forkserver_relay.listen(server, path)
    try:
        out = _client(tmp_path, forkserver_relay.announce(path), "platform", "no_such_module_x")
    finally:
        sock.close()
    assert out.returncode == 0, out.stderr[-3000:]
    # Each request reached the session's server, with the tool's environment
    # and directory, and each job's exit code came back to the tool.
    assert [r["module"] for r in server.requests] == ["platform", "no_such_module_x"]
    assert all(r["env"]["RELAY_MARK"] == "from-the-tool" for r in server.requests)
    assert all(r["cwd"] == str(tmp_path) for r in server.requests)
    assert out.stdout.split() == ["platform", "0", "no_such_module_x", "1"], out.stdout
    assert "Linux" in (tmp_path / "log.platform").read_text()


def test_the_listening_process_and_a_dead_relay_keep_their_own_fork_server(tmp_path, monkeypatch):
    path = str(tmp_path / "relay.sock")
    monkeypatch.setenv(forkserver_relay.ENV, forkserver_relay.announce(path))
    sock = forkserver_relay.listen(StandInServer(), path)
    try:
        assert forkserver_relay.connect() is None  # this process's own relay
    finally:
        sock.close()
    monkeypatch.setenv(forkserver_relay.ENV, f"1:{path}")  # another process's, not listening
    os.unlink(path)
    assert forkserver_relay.connect() is None
