"""Two "hosts" on this machine: network namespaces joined by a veth pair.

Each namespace gets an address the test assigns (10.231.<n>.1 and .2 on a
/24 of its own); traffic goes between them only. :func:`veth_hosts` makes
them and deletes them by name afterwards, even when the test fails. It needs
root and iproute2 (``ip netns``); without them the test fails saying so (it
does not skip).
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


def require_netns() -> None:
    import pytest

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail(
            "this test makes network namespaces: it needs root and iproute2 (`ip netns`); "
            "run the suite as root (CI does)"
        )


@contextmanager
def bare_hosts(tag: str) -> Iterator[tuple[Host, Host]]:
    """Two namespaces, ``ppspec-<tag>-<pid>-{a,b}``, with no link between them
    (the caller adds one, e.g. tests/delay_line.py); addresses as veth_hosts'."""
    require_netns()
    pid = os.getpid()
    subnet = 1 + pid % 250
    a = Host(f"ppspec-{tag}-{pid}-a", f"pt{pid % 100000}a", f"10.233.{subnet}.1")
    b = Host(f"ppspec-{tag}-{pid}-b", f"pt{pid % 100000}b", f"10.233.{subnet}.2")
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
    require_netns()
    pid = os.getpid()
    subnet = 1 + pid % 250
    a = Host(f"ppspec-{tag}-{pid}-a", f"pp{pid % 100000}a", f"10.231.{subnet}.1")
    b = Host(f"ppspec-{tag}-{pid}-b", f"pp{pid % 100000}b", f"10.231.{subnet}.2")
    try:
        for host in (a, b):
            _ip("netns", "add", host.netns)
            _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("link", "add", a.ifname, "netns", a.netns, "type", "veth", "peer", "name", b.ifname)
        _ip("link", "set", b.ifname, "netns", b.netns)
        for host in (a, b):
            _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", host.ifname)
            _ip("-n", host.netns, "link", "set", host.ifname, "up")
        yield a, b
    finally:
        for host in (a, b):
            subprocess.run(["ip", "netns", "delete", host.netns], capture_output=True)


def link_down(host: Host) -> None:
    """Cut the link: ``host``'s end of the veth pair down (no FIN, no reset)."""
    _ip("-n", host.netns, "link", "set", host.ifname, "down")
