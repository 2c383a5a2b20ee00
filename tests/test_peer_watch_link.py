"""The PP peer watcher notices a lost link between two hosts within its bound.

Two network namespaces joined by a veth pair stand for two hosts
(``vllm_ppspec_tools/hosts/netns.py``). A rank's watcher connection
(``runner/health/peer_watch.py``: TCP keepalive, idle 3 s, 3 probes 1 s apart)
stays quiet while the link is up and idle, and reports the peer gone once the
link is cut without a FIN or a reset, as when a cable or a host's network goes.
"""

from __future__ import annotations

import subprocess
import sys
import time

from vllm_ppspec_tools.hosts.netns import link_down, veth_hosts

# The bound stated in docs/reliability.md for a lost link: keepalive's
# 3 + 3 x 1 s, and the slack of the kernel's timers.
LOST_LINK_BOUND_S = 10.0

LISTEN = """
import socket, sys, time
listener = socket.create_server((sys.argv[1], 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
time.sleep(120)
"""

WATCH = """
import socket, sys
from vllm_ppspec.runner.health.peer_watch import _keepalive, first_gone
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
sock.settimeout(None)
_keepalive(sock)
print("connected", flush=True)
rank, seen = first_gone({0: sock})
print("gone", rank, seen, flush=True)
"""


def test_a_lost_link_is_noticed_within_the_bound_and_a_quiet_one_is_not():
    with veth_hosts("link") as (a, b):
        procs = []
        try:
            listen = subprocess.Popen(
                a.cmd(sys.executable, "-c", LISTEN, a.addr), stdout=subprocess.PIPE, text=True
            )
            procs.append(listen)
            assert listen.stdout is not None
            port = listen.stdout.readline().strip()
            watch = subprocess.Popen(
                b.cmd(sys.executable, "-c", WATCH, a.addr, port), stdout=subprocess.PIPE, text=True
            )
            procs.append(watch)
            assert watch.stdout is not None
            assert watch.stdout.readline().strip() == "connected"
            # Up and idle for longer than keepalive's idle time plus its probes:
            # the probes are answered, and nothing is reported.
            time.sleep(8.0)
            assert watch.poll() is None, "the watcher reported a healthy idle link gone"
            cut = time.monotonic()
            link_down(a)
            line = watch.stdout.readline().strip()
            noticed = time.monotonic() - cut
            assert line.startswith("gone 0 its connection failed"), line
            assert noticed <= LOST_LINK_BOUND_S, f"noticed after {noticed:.1f} s"
            assert noticed >= 2.0, f"noticed after {noticed:.1f} s: not by keepalive"
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
