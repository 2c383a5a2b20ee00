"""The peer watch follows where the PP ranks are, not ``--nnodes``.

vLLM keeps ``parallel_config.nnodes`` at 1 under Ray, which places ranks on
several hosts. The stand-in here is that placement without Ray (Ray refuses
vLLM's CPU platform): two PP ranks joined by a gloo group, each in its own
network namespace with its own ``/dev/shm`` (``vllm_ppspec_tools/hosts/netns.py``), and nothing
telling them how many nodes there are. Each rank picks its peer-watch address
(``runner/health/placement.py``) and connects its peer watch; the same two ranks in
the root namespace use the loopback.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from tests.delay_ranks import run_json_ranks
from vllm_ppspec_tools.hosts.netns import veth_hosts

REPO = Path(__file__).resolve().parent.parent

RANK = """
import json, os, sys
import torch.distributed as dist
from vllm_ppspec.runner.health.peer_watch import connect_peers
from vllm_ppspec.runner.health.placement import peer_watch_host, pp_on_one_host
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=sys.argv[2], rank=rank, world_size=2)
group = dist.new_group(backend="gloo")
one = pp_on_one_host(group)
host = peer_watch_host(group)
peers = connect_peers(group, host)
print(json.dumps({"one_host": one, "host": host, "peers": sorted(peers)}), flush=True)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    """This environment without VLLM_HOST_IP, with the repository and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_HOST_IP"}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def test_ranks_on_two_hosts_watch_each_other_on_their_own_addresses():
    with veth_hosts("place") as (a, b):
        init = f"tcp://{a.addr}:{_free_port()}"
        cmds = []
        for rank, host in enumerate((a, b)):
            own_shm = f'mount -t tmpfs tmpfs /dev/shm && exec {sys.executable} -c "$0" $@'
            cmds.append(host.cmd("unshare", "--mount", "sh", "-c", own_shm, RANK, str(rank), init))
        envs = [_env(VLLM_HOST_IP=h.addr, GLOO_SOCKET_IFNAME=h.ifname) for h in (a, b)]
        r0, r1 = run_json_ranks(cmds, envs, timeout=120)
    assert (r0["one_host"], r1["one_host"]) == (False, False)
    assert (r0["host"], r1["host"]) == (a.addr, b.addr)
    assert (r0["peers"], r1["peers"]) == ([1], [0])


def test_ranks_on_one_host_watch_each_other_on_the_loopback():
    init = f"tcp://127.0.0.1:{_free_port()}"
    cmds = [[sys.executable, "-c", RANK, str(rank), init] for rank in (0, 1)]
    r0, r1 = run_json_ranks(cmds, [_env(), _env()], timeout=120)
    assert (r0["one_host"], r1["one_host"]) == (True, True)
    assert r0["host"] == r1["host"] == "127.0.0.1"
    assert (r0["peers"], r1["peers"]) == ([1], [0])


def test_the_remote_read_patch_is_installed_whatever_nnodes_says(monkeypatch):
    """An engine core running a plugin scheduler installs it at its first
    post_step, with ``nnodes == 1`` too: it changes only readers vLLM made
    remote (``patches/remote_reads.py``); with vLLM's own scheduler it does not."""
    from types import SimpleNamespace

    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
    from vllm.v1.engine.core import EngineCore

    from vllm_ppspec.patches import remote_reads
    from vllm_ppspec.plugin import register
    from vllm_ppspec.policy import Mode

    register()
    original = getattr(MessageQueue.dequeue, "__wrapped__", MessageQueue.dequeue)
    monkeypatch.setattr(MessageQueue, "dequeue", original)
    monkeypatch.setattr(remote_reads, "installed", False)
    engine = SimpleNamespace(
        scheduler=SimpleNamespace(),  # vLLM's own scheduler
        vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(nnodes=1)),
        check_for_draft_tokens=False,  # vLLM's own post_step then does nothing
    )
    EngineCore.post_step(engine, True)  # type: ignore[arg-type]
    assert not getattr(MessageQueue.dequeue, remote_reads._FLAG, False)
    engine.scheduler = SimpleNamespace(ppspec_mode=Mode.LANES)
    EngineCore.post_step(engine, True)  # type: ignore[arg-type]
    assert getattr(MessageQueue.dequeue, remote_reads._FLAG, False)
