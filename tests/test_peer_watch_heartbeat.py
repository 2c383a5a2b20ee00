"""A frozen PP peer is seen (runner/health/heartbeat.py, guardian.py), and the
watch is on the PP data's path (runner/health/placement.py, peer_links.py).

- The silence logic: a peer that stops beating is declared gone after the
  bound; one whose beats come late but within it is not.
- Through the watch's own loop (``peer_watch.first_gone``) over real UDP
  beats: a peer process that is SIGSTOPped keeps its TCP connection open
  (its kernel answers) and is declared gone by its missing beats.
- The guardian: a worker whose watch stops beating (SIGSTOP) is SIGKILLed
  after the bound and two beats; one that beats, or that ends, is left alone.
  Its start rule, through ``peer_watch.watch_pp_peers`` on gloo ranks (what
  the runner calls): started where a peer is on another executor, not where
  every peer is on this rank's own.
- The watch's connections and beats leave from its address (where it is
  chosen: tests/test_placement.py).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vllm_ppspec.runner.health import heartbeat, peer_watch

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}

# ----------------------------------------------------------------------------
# The silence logic (a clock of our own)
# ----------------------------------------------------------------------------


def test_a_peer_that_stops_beating_is_silent_after_the_bound_and_not_before():
    silence = heartbeat.Silence([0, 2], bound_s=15.0, now=100.0)
    for t in range(101, 110):  # both beat each second
        silence.heard(0, float(t))
        silence.heard(2, float(t))
    # rank 2 stops at 109
    for t in range(110, 124):
        silence.heard(0, float(t))
    assert silence.silent(123.9) == []
    assert silence.silent(124.0) == []  # exactly the bound: not over it
    assert silence.silent(124.1) == [2]
    assert silence.next_deadline([2]) == 124.0
    assert silence.silent(124.1, among=[0]) == []  # a rank no longer watched is not judged


def test_a_peer_whose_beats_come_late_but_within_the_bound_is_not_silent():
    silence = heartbeat.Silence([1], bound_s=15.0, now=0.0)
    t = 0.0
    for gap in (1.0, 14.9, 0.5, 13.0, 14.99):  # a stall of 14.9 s, then of 13 s ...
        assert silence.silent(t + gap - 0.001) == []
        t += gap
        silence.heard(1, t)
    assert silence.silent(t + 15.0) == []
    assert silence.silent(t + 15.01) == [1]


def test_a_peer_never_heard_is_named_so():
    said = heartbeat.silent_message(15, ever_heard=False, beat_port=4242)
    assert said.startswith("no heartbeat for 15 s ($VLLM_PPSPEC_PEER_KEEPALIVE_S)")
    assert "none of its beats ever arrived" in said and "UDP port 4242" in said
    assert "never" not in heartbeat.silent_message(15, ever_heard=True)


# ----------------------------------------------------------------------------
# Real beats through the watch's loop
# ----------------------------------------------------------------------------


def _udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def _pair(bound_s: float) -> tuple[heartbeat.Heartbeat, heartbeat.Heartbeat]:
    """Rank 0's and rank 1's heartbeats, beating each other on the loopback."""
    socks = [_udp(), _udp()]
    tokens = [os.urandom(16), os.urandom(16)]
    return tuple(  # type: ignore[return-value]
        heartbeat.Heartbeat(
            r, tokens[r], socks[r], {1 - r: (socks[1 - r].getsockname(), tokens[1 - r])}, bound_s
        )
        for r in (0, 1)
    )


def _beat_for(hb: heartbeat.Heartbeat, seconds: float, every: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hb.send(time.monotonic())
        hb.receive(time.monotonic())
        time.sleep(every)


def test_the_watch_declares_a_peer_gone_when_its_beats_stop_and_not_while_they_come():
    mine, theirs = _pair(bound_s=2.0)
    ours, their_end = socket.socketpair()  # the TCP connection: open throughout
    seen: list = []
    thread = threading.Thread(
        target=lambda: seen.append(peer_watch.first_gone({1: ours}, mine)), daemon=True
    )
    thread.start()
    _beat_for(theirs, 3.5, every=1.5)  # late beats, each within the bound
    assert seen == [], seen
    stopped = time.monotonic()
    thread.join(5)
    took = time.monotonic() - stopped
    assert seen and seen[0][0] == 1, seen
    assert seen[0][1].startswith("no heartbeat for 2 s"), seen
    assert "never" not in seen[0][1]
    assert 0.4 <= took <= 3.0, took  # the bound from the last beat (up to 1.5 s before)
    # and the peer heard ours meanwhile
    assert 0 in theirs.silence.ever
    ours.close()
    their_end.close()


def test_a_datagram_without_the_peer_s_token_is_no_beat():
    mine, theirs = _pair(bound_s=2.0)
    forged = heartbeat.BEAT.pack(heartbeat.BEAT_MAGIC, 1, b"x" * 16)
    stray = _udp()
    for payload in (forged, b"garbage", heartbeat.BEAT.pack(b"PPSW", 1, b"x" * 16)):
        stray.sendto(payload, mine.sock.getsockname())
    time.sleep(0.1)
    assert mine.receive(time.monotonic()) == []
    theirs.send(time.monotonic())
    time.sleep(0.1)
    assert mine.receive(time.monotonic()) == [1]
    stray.close()


PEER = """
import os, socket, sys, time
from vllm_ppspec.runner.health import heartbeat, peer_watch
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 0))
tcp = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print(udp.getsockname()[1], flush=True)
port = int(sys.stdin.readline())
hb = heartbeat.Heartbeat(1, b"1" * 16, udp, {0: (("127.0.0.1", port), b"0" * 16)}, 4.0)
print(peer_watch.first_gone({0: tcp}, hb), flush=True)
"""


def test_a_stopped_peer_process_is_declared_gone_while_its_kernel_keeps_the_connection():
    """SIGSTOP: the peer's TCP connection stays open and answered, its beats stop."""
    listener = socket.create_server(("127.0.0.1", 0))
    udp = _udp()
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, str(listener.getsockname()[1])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        conn, _ = listener.accept()
        assert peer.stdout is not None and peer.stdin is not None
        their_port = int(peer.stdout.readline())
        peer.stdin.write(f"{udp.getsockname()[1]}\n")
        peer.stdin.flush()
        mine = heartbeat.Heartbeat(
            0, b"0" * 16, udp, {1: (("127.0.0.1", their_port), b"1" * 16)}, 4.0
        )
        seen: list = []
        thread = threading.Thread(
            target=lambda: seen.append(peer_watch.first_gone({1: conn}, mine)), daemon=True
        )
        thread.start()
        time.sleep(5.0)  # over the bound: the peer beats, nothing is reported
        assert seen == [] and peer.poll() is None
        os.kill(peer.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        thread.join(10)
        took = time.monotonic() - stopped
        assert seen and seen[0][0] == 1 and seen[0][1].startswith("no heartbeat for 4 s"), seen
        assert 2.5 <= took <= 6.0, took
        conn.setblocking(False)
        with pytest.raises(BlockingIOError):
            conn.recv(1)  # the connection is open: no EOF, no reset
    finally:
        peer.kill()
        peer.wait()
        listener.close()
        udp.close()


# ----------------------------------------------------------------------------
# The guardian
# ----------------------------------------------------------------------------

WORKER = """
import socket, sys, threading, time
from vllm_ppspec.runner.health import heartbeat
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 0))
hb = heartbeat.Heartbeat(1, b"1" * 16, udp, {}, float(sys.argv[1]))
hb.start_guardian()
print(hb.guardian.pid, flush=True)
def beat():
    while True:
        hb.send(time.monotonic())
        time.sleep(hb.interval)
threading.Thread(target=beat, daemon=True).start()
time.sleep(float(sys.argv[2]))
"""


def _worker(bound_s: float, lives_s: float) -> tuple[subprocess.Popen, int]:
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(bound_s), str(lives_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert worker.stdout is not None
    return worker, int(worker.stdout.readline())


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    return state == "Z"


def test_the_guardian_kills_a_stopped_worker_after_the_bound():
    worker, guardian = _worker(bound_s=3.0, lives_s=60)
    try:
        time.sleep(4.0)  # beating: left alone past the bound
        assert worker.poll() is None
        os.kill(worker.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        worker.wait(timeout=10)
        took = time.monotonic() - stopped
        assert worker.returncode == -signal.SIGKILL, worker.returncode
        assert 4.0 <= took <= 7.5, took  # the bound and two beats (1 s each) after it
        assert worker.stderr is not None
        err = worker.stderr.read()
        assert "vllm-ppspec: the peer watch of PP rank 1" in err and "stopped or frozen" in err, err
        deadline = time.monotonic() + 5
        while not _gone(guardian):
            assert time.monotonic() < deadline, "the guardian outlived its worker"
            time.sleep(0.1)
    finally:
        worker.kill()
        worker.wait()


def test_the_guardian_ends_with_its_worker():
    worker, guardian = _worker(bound_s=3.0, lives_s=1.0)
    worker.wait(timeout=10)
    assert worker.returncode == 0
    deadline = time.monotonic() + 3
    while not _gone(guardian):
        assert time.monotonic() < deadline, "the guardian outlived its worker"
        time.sleep(0.1)


def _watch_started(rank: int, world: int, apart: bool):
    """This rank's watch, started as the runner starts it (``watch_pp_peers``:
    connect_peers, its executor comparison, the guardian rule, the thread).
    ``apart``: rank 1 reports another executor (as a rank that another
    ``vllm serve`` started would); otherwise both ranks share their parent,
    the harness's fork server (one executor)."""
    import torch.distributed as dist

    from vllm_ppspec.runner.health import peer_links, rank_errors

    # The peer ending after this function is not this test's: nothing ends the rank.
    rank_errors.end_worker = lambda error, what: None
    if apart and rank == 1:
        own = peer_links.executor_id
        peer_links.executor_id = lambda: f"{own()} (another vllm serve)"
    group = dist.new_group(backend="gloo")
    assert peer_watch.watch_pp_peers(group, "127.0.0.1") == [1 - rank]
    peers = peer_watch._WATCH[0].peers
    assert peers.heartbeat is not None
    guardian = peers.heartbeat.guardian
    started = None
    if guardian is not None:
        # Popen returns once the exec closed its error pipe, which the kernel
        # does before it sets the new image's arguments: read until they show.
        deadline = time.monotonic() + 5
        while not (cmdline := Path(f"/proc/{guardian.pid}/cmdline").read_bytes()):
            assert time.monotonic() < deadline, "the guardian's arguments never showed"
            time.sleep(0.01)
        argv = cmdline.split(b"\0")
        started = {
            "pid": guardian.pid,
            "argv": [a.decode() for a in argv if a],
            "running": guardian.poll() is None,
        }
    threads = [t.name for t in threading.enumerate()]
    dist.barrier(group)
    return {
        "same_executor": sorted(peers.same_executor),
        "guardian": started,
        "worker": os.getpid(),
        "watching": "ppspec-peer-watch" in threads,
    }


@pytest.mark.parametrize("apart", [False, True], ids=["one-executor", "two-executors"])
def test_the_watch_starts_a_guardian_only_for_a_peer_on_another_executor(apart):
    """Through ``watch_pp_peers`` on two gloo ranks: ranks of one executor
    (one process started both: it ends them) get no guardian; ranks of two
    each get one, a running ``guardian.py`` of that worker's pid, which ends
    with the worker."""
    from tests.distributed import run_ranks

    results = run_ranks(functools.partial(_watch_started, apart=apart), world=2, timeout=60)
    for r in results:
        assert r.error is None and not r.hung, r.message
    for rank, result in enumerate(r.value for r in results):
        assert result["watching"], rank
        if not apart:
            assert result["same_executor"] == [1 - rank], result
            assert result["guardian"] is None, f"rank {rank}: a guardian on one executor"
            continue
        assert result["same_executor"] == [], result
        started = result["guardian"]
        assert started is not None, f"rank {rank}: no guardian for a peer on another executor"
        assert started["running"], started
        assert str(heartbeat.GUARDIAN) in started["argv"], started
        assert started["argv"][started["argv"].index(str(heartbeat.GUARDIAN)) + 1] == str(
            result["worker"]
        ), started
        deadline = time.monotonic() + 5
        while not _gone(started["pid"]):  # its worker ended: its pipe closed
            assert time.monotonic() < deadline, f"rank {rank}'s guardian outlived its worker"
            time.sleep(0.1)


# ----------------------------------------------------------------------------
# The watch's own address, both ends
# ----------------------------------------------------------------------------


def _connect_from(rank: int, world: int):
    import torch.distributed as dist

    from vllm_ppspec.runner.health import peer_links

    group = dist.new_group(backend="gloo")
    peers = peer_links.connect_peers(group, "127.0.0.2")
    assert peers.heartbeat is not None
    return {
        "tcp": {r: (s.getsockname()[0], s.getpeername()[0]) for r, s in peers.items()},
        "udp": peers.heartbeat.sock.getsockname()[0],
        "beat_to": {r: a[0] for r, (a, _) in peers.heartbeat.peers.items()},
    }


def test_the_watch_s_connections_and_beats_leave_from_its_address():
    """Both ends of every watch connection, and the beats, are on the watch's
    address (127.0.0.2 here; a connection to it from no address left from
    127.0.0.1, the loopback route's source)."""
    from tests.distributed import run_ranks

    results = run_ranks(_connect_from, world=2, timeout=60)
    for r in results:
        assert r.error is None and not r.hung, r.message
    for r, result in enumerate(results):
        assert result.value == {
            "tcp": {1 - r: ("127.0.0.2", "127.0.0.2")},
            "udp": "127.0.0.2",
            "beat_to": {1 - r: "127.0.0.2"},
        }
