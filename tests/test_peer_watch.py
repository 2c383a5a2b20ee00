"""runner/health/peer_watch.py without an engine: descriptors above 1024, stray
connections at set-up, the keepalive setting, and the goodbye of an orderly
stop (two sockets of this process stand for two ranks)."""

from __future__ import annotations

import os
import resource
import socket
import struct
import threading
import time

import pytest

from vllm_ppspec.runner.health import keepalive, peer_links, peer_watch, rank_errors

# ----------------------------------------------------------------------------
# More than 1024 descriptors (vLLM raises a worker's limit; select() cannot go there)
# ----------------------------------------------------------------------------


@pytest.fixture
def over_1024_descriptors():
    """This process holds more than 1024 descriptors (the soft limit raised
    for the test, as vLLM raises a worker's); the next sockets get numbers
    above 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.fail(f"the hard descriptor limit is {hard}: the test needs 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of one loopback TCP connection (the peer watch's kind)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        one = socket.create_connection(listener.getsockname())
        other, _ = listener.accept()
    return one, other


def test_a_dead_peer_is_seen_when_the_process_holds_over_1024_descriptors(
    over_1024_descriptors,
):
    ours, theirs = _tcp_pair()
    assert ours.fileno() > 1024, ours.fileno()
    seen: list[tuple[int, str] | BaseException] = []

    def watch() -> None:
        try:
            seen.append(peer_watch.first_gone({1: ours}))
        except BaseException as e:  # noqa: BLE001 - select() raised ValueError here
            seen.append(e)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    time.sleep(0.2)
    theirs.close()  # what the kernel does when the peer process ends
    thread.join(5)
    assert seen == [(1, "its connection closed")]
    ours.close()


# ----------------------------------------------------------------------------
# Set-up: only the lower ranks, each once, with its token, within the window
# ----------------------------------------------------------------------------

# The hello a lower rank sends when it connects: a magic, its rank, its token.
HELLO = struct.Struct("!4sI16s")
MAGIC = b"PPSW"
TOKENS = {0: b"a" * 16, 1: b"b" * 16}


def _hello(rank: int, token: bytes) -> bytes:
    return HELLO.pack(MAGIC, rank, token)


def test_the_hello_is_the_one_these_tests_send():
    assert (peer_links.HELLO.format, peer_links.MAGIC) == (HELLO.format, MAGIC)


STRAYS = {
    "garbage": os.urandom(HELLO.size),
    "an old 4-byte rank": struct.pack("!i", 0),
    "a rank out of range": _hello(7, TOKENS[0]),
    "the accepting rank itself": _hello(2, TOKENS[0]),
    "rank 0 with rank 1's token": _hello(0, TOKENS[1]),
    "closed before its hello": b"",
    "half a hello, then closed": _hello(0, TOKENS[0])[:10],
}


def test_strays_are_closed_and_take_no_slot():
    """Rank 2 of 3 accepts ranks 0 and 1. Strays connect first, and a second
    rank 0 after the real one; each is closed, the real ranks get their slots."""
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()
    clients = []
    for payload in STRAYS.values():
        stray = socket.create_connection(address)
        if payload:
            stray.sendall(payload)
        else:
            stray.shutdown(socket.SHUT_WR)
        if payload == STRAYS["half a hello, then closed"]:
            stray.shutdown(socket.SHUT_WR)
        clients.append(stray)
    silent = socket.create_connection(address)  # never says anything
    rank0 = socket.create_connection(address)
    rank0.sendall(_hello(0, TOKENS[0]))
    time.sleep(0.2)  # the real rank 0 is in before the copy below
    copy0 = socket.create_connection(address)
    copy0.sendall(_hello(0, TOKENS[0]))
    rank1 = socket.create_connection(address)
    rank1.sendall(_hello(1, TOKENS[1]))
    try:
        got = peer_links.accept_lower_ranks(listener, TOKENS, time.monotonic() + 10)
        assert sorted(got) == [0, 1]
        assert got[0].getpeername() == rank0.getsockname()
        assert got[1].getpeername() == rank1.getsockname()
        for stray in [*clients, silent, copy0]:
            stray.settimeout(5)
            assert stray.recv(1) == b"", "a stray connection was left open"
    finally:
        listener.close()
        for sock in [*clients, silent, rank0, copy0, rank1]:
            sock.close()


def test_a_lower_rank_that_never_connects_fails_set_up_naming_it():
    listener = socket.create_server(("127.0.0.1", 0))
    rank0 = socket.create_connection(listener.getsockname())
    rank0.sendall(_hello(0, TOKENS[0]))
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"PP ranks \[1\] did not connect"):
            peer_links.accept_lower_ranks(listener, TOKENS, time.monotonic() + 1.0)
        assert time.monotonic() - t0 < 3
        rank0.settimeout(5)
        assert rank0.recv(1) == b"", "rank 0's connection was kept after the failure"
    finally:
        listener.close()
        rank0.close()


def _set_up_with_strays(rank: int, world: int):
    """Through connect_peers on gloo ranks: before rank 0 connects to rank 1,
    strays connect to rank 1 and claim rank 0 (an old 4-byte hello, garbage,
    a new hello without the token) or close at once."""
    import torch.distributed as dist

    group = dist.new_group(backend="gloo")
    strays: list[socket.socket] = []
    real = socket.create_connection

    def create_connection(address, *args, **kwargs):
        for payload in (struct.pack("!i", 0), b"\xff" * 24, _hello(0, TOKENS[0]), b""):
            stray = real(address)
            stray.sendall(payload)
            strays.append(stray)
        strays[-1].close()
        return real(address, *args, **kwargs)

    socket.create_connection = create_connection  # this rank's process only
    peers = peer_links.connect_peers(group, "127.0.0.1")
    socket.create_connection = real
    mine = {r: s.getsockname() for r, s in peers.items()}
    theirs = {r: s.getpeername() for r, s in peers.items()}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, (mine, theirs), group=group)
    return sorted(peers), everyone


def test_strays_at_set_up_do_not_take_a_rank_s_place():
    from tests.distributed import run_ranks

    results = run_ranks(_set_up_with_strays, world=2, timeout=60)
    for r in results:
        assert r.error is None and not r.hung, r.message
    ranks0, everyone = results[0].value
    ranks1, _ = results[1].value
    assert ranks0 == [1] and ranks1 == [0]
    (mine0, _), (_, theirs1) = everyone
    # The connection rank 1 holds for rank 0 is the one rank 0 holds for rank 1.
    assert theirs1[0] == mine0[1]


# ----------------------------------------------------------------------------
# Keepalive: one host-local setting
# ----------------------------------------------------------------------------


def _keepalive_of(sock: socket.socket) -> tuple[int, int, int, int, int]:
    return (
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        sock.getsockopt(socket.IPPROTO_TCP, keepalive.TCP_USER_TIMEOUT),
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (1, 1, 1, 14, 15000)),
        ("15", (1, 1, 1, 14, 15000)),
        ("4", (1, 1, 1, 3, 4000)),
        ("24", (1, 2, 2, 11, 24000)),
    ],
)
def test_the_keepalive_bound_is_set_by_one_variable(monkeypatch, value, expected):
    """VLLM_PPSPEC_PEER_KEEPALIVE_S: a probe every interval of silence, and
    the user timeout at the value (default 15: a probe each second, gone
    after 15 s without an answer)."""
    if value is None:
        monkeypatch.delenv("VLLM_PPSPEC_PEER_KEEPALIVE_S", raising=False)
    else:
        monkeypatch.setenv("VLLM_PPSPEC_PEER_KEEPALIVE_S", value)
    one, other = _tcp_pair()
    try:
        keepalive.set_keepalive(one)
        got = _keepalive_of(one)
        assert got[0] != 0 and got[1:] == expected[1:]
        assert got[1] + got[2] * got[3] == int(value or 15)  # where the user timeout is ignored
    finally:
        one.close()
        other.close()


def test_the_default_bounds_survive_a_10_s_stall_and_end_within_30_s():
    """The bounds the docs state (docs/reliability.md, "Across hosts"): a
    stall of up to 13 s ends nothing, a silent peer is gone 15-16 s after its
    last sign, which leaves the engine's teardown 14 s of the 30 s bound."""
    survived, gone_by = keepalive.keepalive_bounds(keepalive.DEFAULT_KEEPALIVE_S)
    assert (survived, gone_by) == (13, 16)
    assert survived >= 10 and gone_by <= 20


@pytest.mark.parametrize("value", ["3", "0", "-6", "six", "6.5"])
def test_a_keepalive_bound_that_cannot_be_set_is_refused_naming_it(monkeypatch, value):
    monkeypatch.setenv("VLLM_PPSPEC_PEER_KEEPALIVE_S", value)
    with pytest.raises(ValueError, match=r"VLLM_PPSPEC_PEER_KEEPALIVE_S.*at least 4"):
        keepalive.keepalive_s()


# ----------------------------------------------------------------------------
# The goodbye of an orderly stop (two sockets; no gloo)
# ----------------------------------------------------------------------------


@pytest.fixture
def outcomes(monkeypatch):
    """What the watch did: 'ended: ...' (end_worker) or 'stopped node'; it
    blocks until one happens (or 2 s pass)."""
    done: list[str] = []
    event = threading.Event()

    def end_worker(error, what):
        done.append(f"ended: {what}: {error}")
        event.set()

    def stop_this_node(parent):
        assert parent == os.getppid()
        done.append("stopped node")
        event.set()

    monkeypatch.setattr(rank_errors, "end_worker", end_worker)
    monkeypatch.setattr(peer_watch, "stop_this_node", stop_this_node)
    monkeypatch.setattr(peer_watch, "SAME_EXECUTOR_GRACE_S", 0.2)

    def wait(seconds: float = 2.0) -> list[str]:
        event.wait(seconds)
        return done

    yield wait
    for watch in peer_watch._WATCH:  # a thread left waiting acts on nothing after the test
        watch.done = True


def _watch(monkeypatch, headless: bool, same_executor=(), ranks=(0,), me: int = 1):
    """This rank's watch over one socket pair per peer rank; returns the peers' ends."""
    ours, theirs = {}, {}
    for r in ranks:
        ours[r], theirs[r] = socket.socketpair()
    peers = peer_links.Peers(me, ours, frozenset(same_executor))
    monkeypatch.setattr(peer_watch, "connect_peers", lambda group, host: peers)
    peer_watch.set_headless_node(headless)
    try:
        assert peer_watch.watch_pp_peers(None, "127.0.0.1") == sorted(ranks)
    finally:
        peer_watch.set_headless_node(False)
    return theirs


def test_a_goodbye_from_the_leader_stops_a_headless_node_with_one_info_line(
    monkeypatch, outcomes, caplog
):
    theirs = _watch(monkeypatch, headless=True)
    with caplog.at_level("INFO", logger="vllm.ppspec"):
        theirs[0].sendall(peer_watch.GOODBYE)
        theirs[0].close()
        assert outcomes() == ["stopped node"]
        time.sleep(0.3)
    assert outcomes(0) == ["stopped node"], "the closed connection after it was reported"
    lines = [r for r in caplog.records if "stopped in order" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in lines] == [
        (
            "INFO",
            "vllm-ppspec: PP rank 0 stopped in order (it said goodbye): "
            "stopping this node's vLLM (PP rank 1)",
        )
    ]


def test_a_killed_peer_without_a_goodbye_is_still_reported(monkeypatch, outcomes):
    theirs = _watch(monkeypatch, headless=True)
    theirs[0].close()  # SIGKILL: the kernel closes its sockets, nothing sent
    assert outcomes() == ["ended: a PP peer died: PP rank 0: its connection closed"]


def test_a_goodbye_to_the_leader_from_another_node_ends_it_naming_the_goodbye(
    monkeypatch, outcomes
):
    """The leader cannot serve without that node: it ends as for a dead peer."""
    theirs = _watch(monkeypatch, headless=False, ranks=(1,), me=0)
    theirs[1].sendall(peer_watch.GOODBYE)
    assert outcomes() == [
        "ended: a PP peer stopped: PP rank 1: it stopped in order (it said goodbye)"
    ]


def test_a_goodbye_from_this_rank_s_own_executor_is_left_to_it(monkeypatch, outcomes):
    """Rank 0 is this executor's and says goodbye: nothing happens; rank 2,
    another node's, dies later: reported."""
    theirs = _watch(monkeypatch, headless=False, same_executor=(0,), ranks=(0, 2))
    theirs[0].sendall(peer_watch.GOODBYE)
    theirs[0].close()
    assert outcomes(0.5) == []
    theirs[2].close()
    assert outcomes() == ["ended: a PP peer died: PP rank 2: its connection closed"]


def test_a_rank_that_says_goodbye_tells_every_peer_and_reports_nothing_after(monkeypatch, outcomes):
    theirs = _watch(monkeypatch, headless=True, ranks=(0, 2))
    peer_watch.say_goodbye()
    peer_watch.say_goodbye()  # once only
    for r in (0, 2):
        theirs[r].settimeout(2)
        assert theirs[r].recv(8) == peer_watch.GOODBYE
        theirs[r].close()  # the peers stop too
    assert outcomes(0.5) == []


def test_after_its_goodbye_a_rank_still_ends_when_a_peer_of_its_executor_dies(
    monkeypatch, outcomes
):
    """The executor stops this rank because rank 0 died (vLLM's monitor): its
    own teardown would wait on the dead peer, so the rank still ends at once."""
    theirs = _watch(monkeypatch, headless=False, same_executor=(0,), ranks=(0,))
    peer_watch.say_goodbye()
    theirs[0].settimeout(2)
    assert theirs[0].recv(8) == peer_watch.GOODBYE
    theirs[0].close()
    assert outcomes() == ["ended: a PP peer died: PP rank 0: its connection closed"]


def test_the_worker_says_goodbye_before_vllm_s_own_shutdown(monkeypatch):
    from vllm_ppspec.runner.health import orderly_stop

    calls: list[str] = []

    class VllmWorker:
        def shutdown(self):
            calls.append("vLLM's shutdown")

    class Worker(orderly_stop.StopsInOrder, VllmWorker):
        pass

    monkeypatch.setattr(peer_watch, "say_goodbye", lambda: calls.append("goodbye"))
    Worker().shutdown()
    assert calls == ["goodbye", "vLLM's shutdown"]


@pytest.mark.parametrize(
    ("backend", "node_rank", "nnodes", "headless"),
    [
        ("mp", 1, 2, True),
        ("mp", 0, 2, False),
        ("mp", 0, 1, False),
        ("uni", 1, 2, False),
    ],
)
def test_only_a_headless_mp_node_is_stopped_by_its_peers(backend, node_rank, nnodes, headless):
    from vllm.config import ParallelConfig

    from vllm_ppspec.runner.health import orderly_stop

    config = ParallelConfig(
        pipeline_parallel_size=2,
        distributed_executor_backend=backend,
        nnodes=nnodes,
        node_rank=node_rank,
    )
    assert orderly_stop.headless_node(config) is headless
