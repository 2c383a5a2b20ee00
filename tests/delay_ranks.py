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


def run_two_ranks(script: str, tag: str, net: int, delay_ms: float, *args: str) -> list[Any]:
    """Run ``script`` as rank 0 and rank 1 (``argv``: rank, rank 0's address,
    ``args``); each rank's last stdout line, read as JSON."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    with bare_hosts(tag, prefix=tag[:2], net=net) as (a, b):
        with delay_link(a.netns, a.ifname, a.addr, b.netns, b.ifname, b.addr, delay_ms):
            ranks = [
                subprocess.Popen(
                    host.cmd(sys.executable, "-c", script, str(rank), a.addr, *args),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env={**env, "GLOO_SOCKET_IFNAME": host.ifname},
                )
                for rank, host in enumerate((a, b))
            ]
            outs = []
            try:
                for proc in ranks:
                    out, err = proc.communicate(timeout=90)
                    assert proc.returncode == 0, err[-2000:]
                    outs.append(json.loads(out.strip().splitlines()[-1]))
            finally:
                for proc in ranks:
                    proc.kill()
    return outs
