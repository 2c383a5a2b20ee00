"""Two "hosts" on this machine: network namespaces joined by a veth pair.

Each namespace gets an address the caller assigns (10.231.<n>.1 and .2 on a
/24 of its own); traffic goes between them only. :func:`veth_hosts` makes
them and deletes them by name afterwards, even when the caller fails. It needs
root and iproute2 (``ip netns``); without them it raises saying so (a test
using it fails, it does not skip).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    netns: str  # the namespace's name (ip netns)
    ifname: str  # its end of the veth pair
    addr: str  # the address assigned to it

    def cmd(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)


class NetnsUnavailable(RuntimeError):
    """Not root, or no iproute2: network namespaces cannot be made here."""


def require_netns() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise NetnsUnavailable(
            "this makes network namespaces: it needs root and iproute2 (`ip netns`); "
            "run the suite (or the tool) as root (CI does)"
        )


@contextmanager
def bare_hosts(tag: str, prefix: str = "pt", net: int = 233) -> Iterator[tuple[Host, Host]]:
    """Two namespaces, ``ppspec-<tag>-<pid>-{a,b}``, with no link between them
    (the caller adds one: veth_hosts, or delay_line.delay_link), their interface
    names and addresses (``10.<net>.<n>.1`` and ``.2``) chosen for it."""
    require_netns()
    pid = os.getpid()
    subnet = 1 + pid % 250
    a = Host(f"ppspec-{tag}-{pid}-a", f"{prefix}{pid % 100000}a", f"10.{net}.{subnet}.1")
    b = Host(f"ppspec-{tag}-{pid}-b", f"{prefix}{pid % 100000}b", f"10.{net}.{subnet}.2")
    try:
        for host in (a, b):
            _ip("netns", "add", host.netns)
            _ip("-n", host.netns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for host in (a, b):
            subprocess.run(["ip", "netns", "delete", host.netns], capture_output=True)


@contextmanager
def veth_hosts(tag: str) -> Iterator[tuple[Host, Host]]:
    """Two namespaces, ``ppspec-<tag>-<pid>-{a,b}``, linked by a veth pair."""
    with bare_hosts(tag, "pp", 231) as (a, b):
        _ip("link", "add", a.ifname, "netns", a.netns, "type", "veth", "peer", "name", b.ifname)
        _ip("link", "set", b.ifname, "netns", b.netns)
        for host in (a, b):
            _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", host.ifname)
            _ip("-n", host.netns, "link", "set", host.ifname, "up")
        yield a, b


def link_down(host: Host) -> None:
    """Cut the link: ``host``'s end of the veth pair down (no FIN, no reset)."""
    _ip("-n", host.netns, "link", "set", host.ifname, "down")


def link_up(host: Host) -> None:
    """Restore the link cut by :func:`link_down` (the address and its route return)."""
    _ip("-n", host.netns, "link", "set", host.ifname, "up")
