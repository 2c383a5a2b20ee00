"""The PP peer watch rides out a stalled link and notices a lost one within its bound.

Two network namespaces joined by a veth pair stand for two hosts
(``vllm_ppspec_tools/hosts/netns.py``). A rank's watcher connection
(``runner/health/peer_watch.py``, its default keepalive: ``keepalive.py``, a
probe each second of silence, gone after 15 s without an answer) stays quiet
while the link is up and idle and through a 10 s stall (the link down, no
FIN or reset, then up again: a switch failover), and reports the peer gone,
naming it timed out, once the link is cut for good.

The beats (``runner/health/heartbeat.py``) ride out the same stall and name
the cut link silent by themselves: in that case the connections' keepalive is
set far beyond the test's window (:data:`LATE_KEEPALIVE_S`), so only the
missing beats can report the peer, as they alone report a frozen peer whose
kernel still answers the keepalive. Each path has its own case and its own
message: "Connection timed out" (the keepalive), "no heartbeat for" (the beats).
"""

from __future__ import annotations

import select
import subprocess
import sys
import time

from vllm_ppspec.runner.health.keepalive import DEFAULT_KEEPALIVE_S, keepalive_bounds
from vllm_ppspec_tools.hosts.netns import link_down, link_up, veth_hosts

STALL_S = 10.0  # the stall issue 34 asks to survive
SURVIVED_S, GONE_BY_S = keepalive_bounds(DEFAULT_KEEPALIVE_S)
SLACK_S = 2.0  # the kernel's timers and this test's polling
# The beating case's TCP keepalive: past the end of its window, so that only
# the beats (their bound: the default, 15 s) can name the cut link's peer.
LATE_KEEPALIVE_S = 120


def _line_within(proc: subprocess.Popen, seconds: float) -> str | None:
    """The next line ``proc`` prints within ``seconds``, or None."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    return proc.stdout.readline().strip() if ready else None


LISTEN = """
import socket, sys, time
listener = socket.create_server((sys.argv[1], 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
time.sleep(120)
"""

WATCH = """
import socket, sys
from vllm_ppspec.runner.health.keepalive import set_keepalive
from vllm_ppspec.runner.health.peer_watch import first_gone
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
sock.settimeout(None)
set_keepalive(sock)
print("connected", flush=True)
rank, seen = first_gone({0: sock})
print("gone", rank, seen, flush=True)
"""


def test_a_stalled_link_ends_nothing_and_a_lost_one_is_noticed_within_the_bound():
    assert STALL_S <= SURVIVED_S
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
            time.sleep(2.0)  # idle, probed and answered
            # The stall: nothing passes for 10 s, then the link is back.
            link_down(a)
            time.sleep(STALL_S)
            link_up(a)
            time.sleep(2.0 + SLACK_S)  # the next probes are answered
            assert watch.poll() is None, "the watcher reported a stalled link's peer gone"
            # For good: no FIN, no reset, no answer.
            cut = time.monotonic()
            link_down(a)
            line = _line_within(watch, GONE_BY_S + 2 * SLACK_S)
            noticed = time.monotonic() - cut
            assert line is not None, f"the cut link's peer not reported after {noticed:.1f} s"
            assert line.startswith("gone 0 its connection failed (Connection timed out)"), line
            assert noticed <= GONE_BY_S + SLACK_S, f"noticed after {noticed:.1f} s"
            assert noticed >= DEFAULT_KEEPALIVE_S - SLACK_S, f"noticed after {noticed:.1f} s"
            print(f"a {STALL_S:.0f} s stall survived; the cut link noticed after {noticed:.1f} s")
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()


# Both ends beat (runner/health/heartbeat.py, the default bound) over the veth
# link, each watching the other with the watch's own loop; the connection's
# keepalive bound is argv[4] (LATE_KEEPALIVE_S: it cannot fire in the window).
BEATING = """
import os, socket, sys
from vllm_ppspec.runner.health.heartbeat import Heartbeat
from vllm_ppspec.runner.health.keepalive import keepalive_s, set_keepalive
from vllm_ppspec.runner.health.peer_watch import first_gone
rank, mine, theirs = int(sys.argv[1]), sys.argv[2], sys.argv[3]
tcp_keepalive_s = int(sys.argv[4])
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((mine, 7001))
if rank == 0:
    listener = socket.create_server((mine, 7000))
    print("listening", flush=True)
    sock, _ = listener.accept()
else:
    sock = socket.create_connection((theirs, 7000), timeout=10, source_address=(mine, 0))
sock.settimeout(None)
set_keepalive(sock, tcp_keepalive_s)
tokens = {0: b"0" * 16, 1: b"1" * 16}
hb = Heartbeat(rank, tokens[rank], udp, {1 - rank: ((theirs, 7001), tokens[1 - rank])},
               float(keepalive_s()))
print("connected", flush=True)
peer, seen = first_gone({1 - rank: sock}, hb)
print("gone", peer, seen, flush=True)
"""


def test_beating_peers_ride_out_a_stalled_link_and_name_a_cut_one_silent():
    """The beats are datagrams: a 10 s stall holds none of them back for
    TCP's backoff (after it the next beat arrives at once), so it ends
    nothing; the link cut for good is named by the missing beats ("no
    heartbeat for 15 s") within the bound. The connection's keepalive is set
    to 120 s: it cannot report the peer in this window, the beats must."""
    assert STALL_S <= SURVIVED_S
    assert LATE_KEEPALIVE_S > GONE_BY_S + 2 * SLACK_S
    with veth_hosts("beat") as (a, b):
        procs = []
        try:
            for rank, (me, other) in enumerate(((a, b), (b, a))):
                argv = (str(rank), me.addr, other.addr, str(LATE_KEEPALIVE_S))
                proc = subprocess.Popen(
                    me.cmd(sys.executable, "-c", BEATING, *argv),
                    stdout=subprocess.PIPE,
                    text=True,
                )
                procs.append(proc)
                assert proc.stdout is not None
                if rank == 0:
                    assert proc.stdout.readline().strip() == "listening"
            for proc in procs:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == "connected"
            time.sleep(2.0)
            link_down(a)
            time.sleep(STALL_S)
            link_up(a)
            time.sleep(2.0 + SLACK_S)
            assert [p.poll() for p in procs] == [None, None], "a stalled link's peer reported gone"
            cut = time.monotonic()
            link_down(a)
            line = _line_within(procs[1], GONE_BY_S + 2 * SLACK_S)
            noticed = time.monotonic() - cut
            assert line is not None, f"the cut link's peer not reported after {noticed:.1f} s"
            heard = f"gone 0 no heartbeat for {DEFAULT_KEEPALIVE_S} s"
            assert line.startswith(heard) and "Connection timed out" not in line, line
            assert DEFAULT_KEEPALIVE_S - SLACK_S <= noticed <= GONE_BY_S + SLACK_S, noticed
            print(f"beating: a {STALL_S:.0f} s stall survived; cut noticed after {noticed:.1f} s")
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
