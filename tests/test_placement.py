"""The peer watch follows where the PP ranks are, not ``--nnodes``.

vLLM keeps ``parallel_config.nnodes`` at 1 under Ray, which places ranks on
several hosts. The stand-in here is that placement without Ray (Ray refuses
vLLM's CPU platform): two PP ranks joined by a gloo group, each in its own
network namespace (``vllm_ppspec_tools/hosts/netns.py``), with its own
``/dev/shm`` or one shared between them (two containers with their own
network and ``--ipc=host``), and nothing telling them how many nodes there
are. Each rank picks its peer-watch address (``runner/health/placement.py``)
and connects its peer watch; the same two ranks in the root namespace use
the loopback. Under Ray the address is Ray's node IP, not ``get_ip()``'s (a
stand-in for ``ray``). With ``GLOO_SOCKET_IFNAME`` set, the watch is on the PP
data's path: that interface's address, whatever ``VLLM_HOST_IP`` or the
default route say; across the two namespaces too, where gloo's interface is
on a second network (``netns.second_network``) and ``VLLM_HOST_IP`` and the
TCP store are on the first.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.delay_ranks import run_json_ranks
from vllm_ppspec.runner.health import placement
from vllm_ppspec_tools.hosts.netns import _ip, bare_hosts, second_network, veth_hosts

REPO = Path(__file__).resolve().parent.parent

# Each rank ends with no gloo or TCP-store thread left (``threads_left``). vLLM
# is imported first, as in a vLLM worker: imported after the group exists
# (placement.peer_watch_host imports it), it loads torch.distributed.nn.functional,
# whose collectives' default ``group=group.WORLD`` is evaluated then and keeps the
# default group alive through destroy_process_group; its threads then met the
# interpreter's teardown, and now and then one that wanted the GIL was ended
# inside a noexcept frame: "terminate called without an active exception".
RANK = """
import json, os, pathlib, sys, time
import torch.distributed as dist
import vllm.utils.network_utils  # before any group: see the note above RANK
from vllm_ppspec.runner.health.peer_links import connect_peers
from vllm_ppspec.runner.health.placement import peer_watch_host, pp_on_one_host
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=sys.argv[2], rank=rank, world_size=2)
group = dist.new_group(backend="gloo")
one = pp_on_one_host(group)
host = peer_watch_host(group)
peers = connect_peers(group, host)
del group
dist.destroy_process_group()
def left():
    names = []
    for t in pathlib.Path("/proc/self/task").iterdir():
        try:
            names.append((t / "comm").read_text().strip())
        except OSError:  # a thread that ended while listed
            pass
    return sorted(n for n in names if n.startswith(("gloo", "pt_gloo", "pt_tcpstore")))
for _ in range(100):  # the store's server thread ends shortly after the group
    if not left():
        break
    time.sleep(0.05)
print(json.dumps({"one_host": one, "host": host, "peers": peers.addresses, "threads_left": left()}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    """This environment without VLLM_HOST_IP, with the repository and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_HOST_IP"}
    return {**env, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", **extra}


@pytest.mark.parametrize("shm", ["own", "shared"])
def test_ranks_on_two_hosts_watch_each_other_on_their_own_addresses(shm):
    """``shared``: both namespaces see one ``/dev/shm`` (vLLM's shared-memory
    test says one node); before the network check both ranks listened on
    their own loopback and the connection was refused. Each namespace has two
    addresses: ``VLLM_HOST_IP`` (and the TCP store) on the first network,
    gloo's interface on the second; each watch listens, and is reached, on
    gloo's."""
    with veth_hosts("place") as (a, b), second_network((a, b)) as (ga, gb):
        init = f"tcp://{a.addr}:{_free_port()}"
        cmds = []
        for rank, host in enumerate((a, b)):
            if shm == "shared":
                cmds.append(host.cmd(sys.executable, "-c", RANK, str(rank), init))
                continue
            own_shm = f'mount -t tmpfs tmpfs /dev/shm && exec {sys.executable} -c "$0" $@'
            cmds.append(host.cmd("unshare", "--mount", "sh", "-c", own_shm, RANK, str(rank), init))
        envs = [
            _env(VLLM_HOST_IP=h.addr, GLOO_SOCKET_IFNAME=g.ifname) for h, g in ((a, ga), (b, gb))
        ]
        r0, r1 = run_json_ranks(cmds, envs, timeout=120)
    assert (r0["one_host"], r1["one_host"]) == (False, False)
    assert (r0["threads_left"], r1["threads_left"]) == ([], []), "gloo's threads outlive the group"
    assert (r0["host"], r1["host"]) == (ga.addr, gb.addr)  # not VLLM_HOST_IP's a.addr, b.addr
    assert list(r0["peers"]) == ["1"] and r0["peers"]["1"].startswith(f"{gb.addr}:"), r0
    assert list(r1["peers"]) == ["0"] and r1["peers"]["0"].startswith(f"{ga.addr}:"), r1


def test_ranks_on_one_host_watch_each_other_on_the_loopback():
    init = f"tcp://127.0.0.1:{_free_port()}"
    cmds = [[sys.executable, "-c", RANK, str(rank), init] for rank in (0, 1)]
    r0, r1 = run_json_ranks(cmds, [_env(), _env()], timeout=120)
    assert (r0["one_host"], r1["one_host"]) == (True, True)
    assert (r0["threads_left"], r1["threads_left"]) == ([], []), "gloo's threads outlive the group"
    assert r0["host"] == r1["host"] == "127.0.0.1"
    assert (list(r0["peers"]), list(r1["peers"])) == (["1"], ["0"])


def test_the_loopback_is_chosen_only_for_one_network_namespace():
    """The decision from each rank's (boot id, network namespace)."""
    me = placement.network_id()
    assert me is not None and me == placement.network_id()
    boot = me.split()[0]
    assert placement.one_network([me, me, me]) is True
    assert placement.one_network([me, f"{boot} net:[1]"]) is False  # another namespace
    assert placement.one_network([me, f"another-boot {me.split()[1]}"]) is False  # machine
    assert placement.one_network([me, None]) is None  # unknown: vLLM's shm test decides


class _StandInRay(types.ModuleType):
    """What the placement reads of ``ray`` in a Ray worker."""

    def __init__(self, node_ip: str, connected: bool = True):
        super().__init__("ray")
        self.connected = connected
        self.util = types.SimpleNamespace(get_node_ip_address=lambda: node_ip)

    def is_initialized(self) -> bool:
        return self.connected


def test_under_ray_the_address_is_ray_s_node_ip_not_get_ip_s(monkeypatch):
    """vLLM strips ``VLLM_HOST_IP`` from Ray's actors and its Ray executor
    gives its queues ``ray.util.get_node_ip_address()``: a ``get_ip()`` that
    guesses a non-routable address is not followed under Ray."""
    from vllm.utils import network_utils

    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    monkeypatch.setattr(network_utils, "get_ip", lambda: "192.0.2.1")  # TEST-NET-1
    monkeypatch.setattr(placement, "pp_on_one_host", lambda group: False)
    monkeypatch.setitem(sys.modules, "ray", _StandInRay("10.20.30.40"))
    assert placement.peer_watch_host(None) == "10.20.30.40"
    # Ray imported but not connected (not a Ray worker), or not imported: get_ip().
    monkeypatch.setitem(sys.modules, "ray", _StandInRay("10.20.30.40", connected=False))
    assert placement.peer_watch_host(None) == "192.0.2.1"
    monkeypatch.delitem(sys.modules, "ray")
    assert placement.peer_watch_host(None) == "192.0.2.1"
    # On one network the loopback, under Ray too.
    monkeypatch.setitem(sys.modules, "ray", _StandInRay("10.20.30.40"))
    monkeypatch.setattr(placement, "pp_on_one_host", lambda group: True)
    assert placement.peer_watch_host(None) == "127.0.0.1"


def test_the_remote_read_patch_is_installed_whatever_nnodes_says(monkeypatch):
    """An engine core running a plugin scheduler installs it at its first
    post_step, with ``nnodes == 1`` too: it changes only readers vLLM made
    remote (``patches/engine_core/remote_reads.py``); with vLLM's own scheduler it does not."""
    from types import SimpleNamespace

    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
    from vllm.v1.engine.core import EngineCore

    from vllm_ppspec import patches
    from vllm_ppspec.choice.policy import Mode
    from vllm_ppspec.patches.engine_core import remote_reads
    from vllm_ppspec.plugin import register

    register()
    original = getattr(MessageQueue.dequeue, "__wrapped__", MessageQueue.dequeue)
    monkeypatch.setattr(MessageQueue, "dequeue", original)
    monkeypatch.setattr(patches, "installed_groups", set())
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


def test_with_gloo_s_interface_set_the_watch_listens_on_its_address(monkeypatch):
    """``GLOO_SOCKET_IFNAME`` names the interface gloo (the PP data on CPU)
    binds: its address wins over ``VLLM_HOST_IP`` and ``get_ip()``'s guess."""
    from vllm.utils import network_utils

    monkeypatch.setenv("VLLM_HOST_IP", "192.0.2.1")  # TEST-NET-1: elsewhere
    monkeypatch.setattr(network_utils, "get_ip", lambda: "192.0.2.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert placement.node_address() == "127.0.0.1"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo,eth9")  # gloo's first device
    assert placement.node_address() == "127.0.0.1"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "no-such-if")  # then vLLM's address
    assert placement.node_address() == "192.0.2.1"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert placement.node_address() == "192.0.2.1"


ADDRESS = """
from vllm_ppspec.runner.health import placement
print(placement.node_address())
"""


def test_on_a_host_with_two_interfaces_the_watch_follows_gloo_s_not_the_default_route():
    """A namespace with two interfaces (veth pairs, both ends in it), the
    default route on the first: vLLM's
    ``get_ip()`` guesses the first; gloo's interface is the second."""
    with bare_hosts("gif", prefix="gi", net=236, count=1) as (host,):
        subnet = host.addr.split(".")[2]
        for name, net in (("gi0", 237), ("gi1", 238)):
            _ip("-n", host.netns, "link", "add", name, "type", "veth", "peer", "name", f"{name}p")
            _ip("-n", host.netns, "addr", "add", f"10.{net}.{subnet}.1/24", "dev", name)
            _ip("-n", host.netns, "link", "set", name, "up")
        _ip("-n", host.netns, "route", "add", "default", "via", f"10.237.{subnet}.2")
        env = {k: v for k, v in _env().items() if k != "GLOO_SOCKET_IFNAME"}

        def address(**extra: str) -> str:
            out = subprocess.run(
                host.cmd(sys.executable, "-c", ADDRESS),
                env={**env, **extra},
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            ).stdout
            return out.strip().splitlines()[-1]

        assert address() == f"10.237.{subnet}.1"  # get_ip(): the default route's
        assert address(GLOO_SOCKET_IFNAME="gi1") == f"10.238.{subnet}.1"
