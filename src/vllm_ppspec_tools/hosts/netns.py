"""Hosts on this machine: network namespaces joined by a veth pair (two) or
by a bridge (any number).

Each namespace gets an address the caller assigns (10.<net>.<n>.1, .2, ...
on a /24 of its own); traffic goes between them only. :func:`veth_hosts` and
:func:`bridge_hosts` make them and delete them by name afterwards, even when
the caller fails. :func:`second_network` joins the same namespaces by a
second network (another interface and address on each host: a data
network beside the hosts' own). They need root and iproute2 (``ip netns``);
without them they raise saying so (a test using them fails, it does not skip).
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


LETTERS = "abcdefgh"  # the hosts' names: ppspec-<tag>-<pid>-<letter>


@contextmanager
def bare_hosts(
    tag: str, prefix: str = "pt", net: int = 233, count: int = 2
) -> Iterator[tuple[Host, ...]]:
    """``count`` namespaces, ``ppspec-<tag>-<pid>-{a,b,...}``, with no link
    between them (the caller adds one: veth_hosts, bridge_hosts or
    delay_line.delay_link), their interface names and addresses
    (``10.<net>.<n>.1``, ``.2``, ...) chosen for it."""
    require_netns()
    assert 1 <= count <= len(LETTERS), count
    pid = os.getpid()
    subnet = 1 + pid % 250
    hosts = tuple(
        Host(f"ppspec-{tag}-{pid}-{x}", f"{prefix}{pid % 100000}{x}", f"10.{net}.{subnet}.{i + 1}")
        for i, x in enumerate(LETTERS[:count])
    )
    try:
        for host in hosts:
            _ip("netns", "add", host.netns)
            _ip("-n", host.netns, "link", "set", "lo", "up")
        yield hosts
    finally:
        for host in hosts:
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


@contextmanager
def bridge_hosts(tag: str, count: int) -> Iterator[tuple[Host, ...]]:
    """``count`` namespaces on one bridge: the bridge lives in a namespace of
    its own, ``ppspec-<tag>-<pid>-sw`` (a switch, no address), joined to each
    host by a veth pair made with both ends in their namespaces; deleting the
    namespaces by name deletes every link."""
    with bare_hosts(tag, "pb", 234, count) as hosts:
        switch = f"ppspec-{tag}-{os.getpid()}-sw"
        try:
            _ip("netns", "add", switch)
            _ip("-n", switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", switch, "link", "set", "br0", "up")
            for host in hosts:
                port = f"{host.ifname}s"
                _ip(
                    "link", "add", host.ifname, "netns", host.netns,
                    "type", "veth", "peer", "name", port, "netns", switch,
                )  # fmt: skip
                _ip("-n", switch, "link", "set", port, "master", "br0")
                _ip("-n", switch, "link", "set", port, "up")
                _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", host.ifname)
                _ip("-n", host.netns, "link", "set", host.ifname, "up")
            yield hosts
        finally:
            subprocess.run(["ip", "netns", "delete", switch], capture_output=True)


SECOND_NET = 239  # second_network's addresses: 10.239.<n>.1, .2, ...


@contextmanager
def second_network(hosts: tuple[Host, ...]) -> Iterator[tuple[Host, ...]]:
    """The same namespaces joined a second time: two by a veth pair, more by
    a bridge in a namespace of its own (``ppspec-...-sw2``). Each host's view
    of it (its namespace, its interface there ``pg...``, its address
    ``10.239.<n>.<i + 1>``); the links go with the namespaces."""
    subnet = hosts[0].addr.split(".")[2]
    second = tuple(
        Host(h.netns, f"pg{h.ifname[2:]}", f"10.{SECOND_NET}.{subnet}.{i + 1}")
        for i, h in enumerate(hosts)
    )
    switch = f"{hosts[0].netns[:-2]}-sw2"  # ppspec-<tag>-<pid>-sw2
    try:
        if len(second) == 2:
            a, b = second
            _ip(
                "link", "add", a.ifname, "netns", a.netns,
                "type", "veth", "peer", "name", b.ifname, "netns", b.netns,
            )  # fmt: skip
        else:
            _ip("netns", "add", switch)
            _ip("-n", switch, "link", "add", "br1", "type", "bridge")
            _ip("-n", switch, "link", "set", "br1", "up")
            for host in second:
                port = f"{host.ifname}s"
                _ip(
                    "link", "add", host.ifname, "netns", host.netns,
                    "type", "veth", "peer", "name", port, "netns", switch,
                )  # fmt: skip
                _ip("-n", switch, "link", "set", port, "master", "br1")
                _ip("-n", switch, "link", "set", port, "up")
        for host in second:
            _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", host.ifname)
            _ip("-n", host.netns, "link", "set", host.ifname, "up")
        yield second
    finally:
        if len(second) > 2:
            subprocess.run(["ip", "netns", "delete", switch], capture_output=True)


def link_down(host: Host) -> None:
    """Cut the link: ``host``'s end of the veth pair down (no FIN, no reset)."""
    _ip("-n", host.netns, "link", "set", host.ifname, "down")


def link_up(host: Host) -> None:
    """Restore the link cut by :func:`link_down` (the address and its route return)."""
    _ip("-n", host.netns, "link", "set", host.ifname, "up")
