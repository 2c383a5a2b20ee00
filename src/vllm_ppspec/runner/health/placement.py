"""Where the PP ranks are: one host, or several.

The peer watch (``peer_watch.py``) listens on the loopback when every PP rank
is on this host, and on the address vLLM uses for this node otherwise. That
is read from where the ranks actually are, not from ``--nnodes``: vLLM keeps
``parallel_config.nnodes`` at 1 under Ray, which places ranks on several
hosts. vLLM's own test (``in_the_same_node_as``: can each rank open a shared
memory segment the first rank made) is the fact used; vLLM uses it for the
same question when it builds its shared-memory broadcasters.
"""

from __future__ import annotations

from typing import Any


def pp_on_one_host(cpu_group: Any) -> bool:
    """Collective on the PP group's gloo ``cpu_group``, every rank, once: a
    broadcast from the group's first rank, then an all-reduce (inside vLLM's
    ``in_the_same_node_as``). Every rank gets the same answer."""
    from vllm.distributed.parallel_state import in_the_same_node_as

    return all(in_the_same_node_as(cpu_group, source_rank=0))


def peer_watch_host(cpu_group: Any) -> str:
    """The address this rank's peer watch listens on (collective, see
    :func:`pp_on_one_host`)."""
    from vllm.utils.network_utils import get_ip, get_loopback_ip

    return get_loopback_ip() if pp_on_one_host(cpu_group) else get_ip()
