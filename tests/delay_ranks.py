"""Two gloo ranks, each in its own network namespace, joined by the delay line
(``vllm_ppspec_tools.hosts.delay_line``: every packet held ``delay_ms`` one
way). Each rank runs a script that prints one JSON line last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from vllm_ppspec_tools.hosts.delay_line import delay_link
from vllm_ppspec_tools.hosts.netns import bare_hosts

REPO = Path(__file__).resolve().parent.parent


def run_json_ranks(cmds: list[list[str]], envs: list[dict[str, str]], timeout: float) -> list[Any]:
    """Start one process per command, wait for each, and return each one's last
    stdout line read as JSON; a rank that fails fails the caller, and any rank
    still running then (left waiting for the failed one) is ended."""
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd, env in zip(cmds, envs, strict=True)
    ]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, err[-3000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outs


def run_two_ranks(script: str, tag: str, net: int, delay_ms: float, *args: str) -> list[Any]:
    """Run ``script`` as rank 0 and rank 1 (``argv``: rank, rank 0's address,
    ``args``); each rank's last stdout line, read as JSON."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    with bare_hosts(tag, prefix=tag[:2], net=net) as (a, b):
        with delay_link(a.netns, a.ifname, a.addr, b.netns, b.ifname, b.addr, delay_ms):
            cmds = [
                host.cmd(sys.executable, "-c", script, str(r), a.addr, *args)
                for r, host in enumerate((a, b))
            ]
            envs = [{**env, "GLOO_SOCKET_IFNAME": host.ifname} for host in (a, b)]
            outs = run_json_ranks(cmds, envs, timeout=90)
    return outs
