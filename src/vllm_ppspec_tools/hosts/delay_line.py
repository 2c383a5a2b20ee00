"""A link with a one-way delay between two network namespaces (no ``tc netem`` here).

    python -m vllm_ppspec_tools.hosts.delay_line NS_A IF_A ADDR_A NS_B IF_B ADDR_B DELAY_MS

One process opens a TUN device in each namespace (entering it with
``setns`` for the ``open`` and the ``TUNSETIFF``, then returning), gives each
its address (/24) and forwards every IP packet from one to the other
``DELAY_MS`` after it was read, in order. It is transparent to TCP (gloo's
mesh, ZMQ, the TCP store). The devices exist while the process runs: the
link goes with it. It prints ``ready`` once both ends are up, and on SIGTERM
its CPU seconds and wall seconds (``cpu 0.41 wall 30.2 packets 1234``), which
:func:`delay_link` checks against a bound.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def open_tun(netns: str, ifname: str) -> int:
    """A TUN device named ``ifname`` in namespace ``netns``."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(target)
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TUN | IFF_NO_PI))
    finally:
        _setns(home)
        os.close(target)
        os.close(home)
    return fd


def forward(a: int, b: int, delay_s: float) -> None:
    """Forward packets a -> b and b -> a, each ``delay_s`` after it was read."""
    queues: dict[int, deque[tuple[float, bytes]]] = {a: deque(), b: deque()}  # by destination
    other = {a: b, b: a}
    stats = {"packets": 0}
    start_cpu, start_wall = time.process_time(), time.monotonic()

    def report(*_: object) -> None:
        cpu, wall = time.process_time() - start_cpu, time.monotonic() - start_wall
        print(f"cpu {cpu:.2f} wall {wall:.1f} packets {stats['packets']}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, report)
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        due = [q[0][0] for q in queues.values() if q]
        timeout = max(0.0, min(due) - now) if due else None
        readable, _, _ = select.select([a, b], [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                queues[other[fd]].append((now + delay_s, packet))
        for dst, queue in queues.items():
            while queue and queue[0][0] <= now:
                _, packet = queue.popleft()
                try:
                    os.write(dst, packet)
                    stats["packets"] += 1
                except OSError:
                    pass  # the other end is down: the packet is lost, as on a wire


def main() -> None:
    ns_a, if_a, addr_a, ns_b, if_b, addr_b, delay_ms = sys.argv[1:8]
    fds = []
    for netns, ifname, addr in ((ns_a, if_a, addr_a), (ns_b, if_b, addr_b)):
        fds.append(open_tun(netns, ifname))
        for args in (["addr", "add", f"{addr}/24", "dev", ifname], ["link", "set", ifname, "up"]):
            subprocess.run(["ip", "-n", netns, *args], check=True)
    forward(fds[0], fds[1], float(delay_ms) / 1000.0)


@contextmanager
def delay_link(
    ns_a: str, if_a: str, addr_a: str, ns_b: str, if_b: str, addr_b: str, delay_ms: float
) -> Iterator[subprocess.Popen[str]]:
    """The delay line between two existing namespaces, for the ``with`` block;
    then its CPU use, which must stay under a quarter of one core."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_ppspec_tools.hosts.delay_line"]
        + [ns_a, if_a, addr_a, ns_b, if_b, addr_b]
        + [str(delay_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", "the delay line did not start"
    try:
        yield proc
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
        print(f"delay line {delay_ms} ms: {out.strip()}")
        fields = out.split()
        if len(fields) >= 4:
            cpu, wall = float(fields[1]), float(fields[3])
            assert cpu <= 0.25 * wall + 0.5, f"the delay line used {cpu} s of CPU in {wall} s"


if __name__ == "__main__":
    main()
