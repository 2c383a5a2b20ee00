"""Where the PP ranks are: one network, or several hosts.

The peer watch (``peer_watch.py``) listens on the loopback when every PP rank
shares this rank's network namespace on this machine, and on this node's
address otherwise. That is read from where the ranks actually are, not from
``--nnodes``: vLLM keeps ``parallel_config.nnodes`` at 1 under Ray, which
places ranks on several hosts.

- **Loopback only inside one network namespace.** Each rank publishes its
  boot id (one per running kernel) and its network namespace
  (``/proc/self/ns/net``); the loopback is used when all are the same. vLLM's
  own test (``in_the_same_node_as``: can each rank open a shared-memory
  segment the first rank made) is not enough: two containers on one machine,
  each with its own network and ``--ipc=host`` (vLLM's recommended flag),
  pass it, and each would listen on its own loopback. It is used only when a
  rank cannot read its namespace.
- **This node's address: the data path's.** The watch is on the path the PP
  data takes, so that what stalls or cuts the data is what the watch sees,
  and a blip elsewhere ends nothing. On CPU the pipeline's transfers go over
  gloo, which binds the interface ``GLOO_SOCKET_IFNAME`` names (its first
  one): when it is set, the watch listens on that interface's IPv4 address.
  Otherwise, under Ray, Ray's node IP (``ray.util.get_node_ip_address()``),
  the address vLLM's Ray executor (``RayExecutorV2``) gives its message
  queues: vLLM strips ``VLLM_HOST_IP`` from Ray's actors, and ``get_ip()``'s
  guess is often not routable between nodes. Elsewhere vLLM's ``get_ip()``
  (``VLLM_HOST_IP`` when set). The watch's connections leave from that
  address too (``peer_links.connect_peers``). On CUDA the pipeline's tensors
  go over NCCL, often on another fabric: the watch cannot see that fabric
  (docs/reliability.md, "Across hosts").
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from pathlib import Path
from typing import Any


def network_id() -> str | None:
    """This process's network namespace on this running kernel, or None if
    unreadable. Equal ids: the same loopback."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        net = os.readlink("/proc/self/ns/net")
    except OSError:
        return None
    return f"{boot} {net}"


def one_network(ids: list[str | None]) -> bool | None:
    """The decision from every rank's :func:`network_id`: True when all are
    the same namespace, False when any two differ, None when one is unknown."""
    if None in ids:
        return None
    return len(set(ids)) == 1


def pp_on_one_host(cpu_group: Any) -> bool:
    """Collective on the PP group's gloo ``cpu_group``, every rank, once: an
    ``all_gather_object`` of :func:`network_id` (and, when a rank could not
    read it, vLLM's ``in_the_same_node_as``). Every rank gets the same answer:
    whether all ranks share one loopback."""
    import torch.distributed as dist

    ids: list[Any] = [None] * dist.get_world_size(cpu_group)
    dist.all_gather_object(ids, network_id(), group=cpu_group)
    shared = one_network(ids)
    if shared is not None:
        return shared
    from vllm.distributed.parallel_state import in_the_same_node_as

    return all(in_the_same_node_as(cpu_group, source_rank=0))


def ray_node_ip() -> str | None:
    """Ray's IP for this node when this process is a Ray worker (Ray imported
    and connected), else None."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        return str(ray.util.get_node_ip_address())
    except Exception:  # a Ray too old or half torn down: vLLM's own guess then
        return None


GLOO_IFNAME_ENV = "GLOO_SOCKET_IFNAME"
SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface ``name``, or None (no such interface, no
    IPv4 address, not Linux)."""
    import fcntl

    request = struct.pack("256s", name.encode()[:15])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
    except OSError:
        return None
    return socket.inet_ntoa(answer[20:24])


def gloo_address() -> str | None:
    """The address gloo binds when ``GLOO_SOCKET_IFNAME`` names its interface
    (the first of a comma-separated list), or None."""
    names = os.environ.get(GLOO_IFNAME_ENV, "").strip()
    if not names:
        return None
    return interface_address(names.split(",")[0].strip())


def node_address() -> str:
    """The address other hosts reach this rank's node on, on the PP data's
    path (see the module docstring)."""
    from vllm.utils.network_utils import get_ip

    return gloo_address() or ray_node_ip() or get_ip()


def peer_watch_host(cpu_group: Any) -> str:
    """The address this rank's peer watch listens on (collective, see
    :func:`pp_on_one_host`)."""
    from vllm.utils.network_utils import get_loopback_ip

    return get_loopback_ip() if pp_on_one_host(cpu_group) else node_address()
