"""A dead PP peer ends this worker, on one host or across hosts; a peer that
stops in order says goodbye first.

A PP peer that dies (killed, out of memory, its host gone) leaves the other
ranks blocked in a pipeline receive or a round that never arrives; vLLM's
executor on another host never learns of it. Each rank therefore holds one TCP
connection to every PP peer, on which nothing is sent but one goodbye byte:

* at runner set-up every PP rank listens on ``host`` (an ephemeral port) and
  the ranks exchange ``(host, port, token, executor)``: one
  ``all_gather_object`` on the PP group's gloo group, every rank, once. The
  token is 16 random bytes per rank; ``executor`` names the vLLM process that
  started the rank (:func:`executor_id`);
* the lower rank of each pair connects and sends a hello: a magic, its rank and
  its token. The higher rank accepts only a hello from a lower rank, with that
  rank's token, once per rank, within :data:`CONNECT_TIMEOUT_S`; any other
  connection (another rank number, garbage, closed early, silent) is closed and
  takes no slot. The listener is closed when every lower rank is in;
* a thread waits on all connections (``selectors``: no limit on descriptor
  numbers, vLLM raises the process's limit). When a peer process ends, however
  it ends, its kernel closes its sockets and this end reads EOF or a reset at
  once; a peer host that vanishes without closing them is caught by TCP
  keepalive. ``VLLM_PPSPEC_PEER_KEEPALIVE_S`` (a host-local setting, whole
  seconds, at least 4, default 15) is the time from the last sign of a silent
  peer to it being declared gone: a probe every ``interval = max(1, total //
  10)`` s of silence (1 s by default) and ``TCP_USER_TIMEOUT`` of ``total``
  (the kernel gives up at the first probe at or after ``total`` s without an
  answer, unacked data or not). A link that stalls and comes back is answered
  at the next probe: a stall shorter than ``total - 2 * interval`` (13 s by
  default) ends nothing, a peer silent for good is gone ``total`` to ``total +
  interval`` s after its last sign (``keepalive.py``). A gone peer
  ends this worker (``rank_errors.end_worker``, naming the peer's rank and
  address) and vLLM stops the engine on this host.

An orderly stop: a worker that vLLM shuts down (its executor stops it, or it
gets SIGINT / SIGTERM) calls :func:`say_goodbye` (``runner/health/orderly_stop.py``):
it sends one byte, :data:`GOODBYE`, to each peer, and from then on reports
only a peer of its own executor that dies without one. A peer that reads it:

* from a rank of its own executor: does nothing (the same executor stops it);
* on a headless node (``vllm serve --headless``, whose process runs the
  executor of this rank): logs one INFO line naming the peer and sends SIGTERM
  to that process, which is how vLLM's own headless node stops in order;
* elsewhere (the leader, whose engine cannot run without that peer): ends the
  worker as for a dead peer, naming the goodbye.

A gone peer of this rank's own executor is reported after
:data:`SAME_EXECUTOR_GRACE_S`: in vLLM's abort-mode stop the API server
SIGKILLs the workers one after another, and the last ones must not report
the first.

Process ids are not used to judge a peer (they mean nothing across hosts or pid
namespaces; the watcher before this one checked ``os.kill(pid, 0)`` and both
killed healthy engines and missed dead peers). Only the parent's is read:
:func:`executor_id` puts it with the boot id and the pid namespace, to tell
whether two ranks were started by the same process, and
:func:`stop_this_node` signals it.
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import signal
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from vllm_ppspec.runner.health.keepalive import KEEPALIVE_ENV, keepalive_s, set_keepalive

CONNECT_TIMEOUT_S = 30.0
TOKEN_BYTES = 16
HELLO = struct.Struct(f"!4sI{TOKEN_BYTES}s")  # magic, the connecting rank, its token
MAGIC = b"PPSW"
GOODBYE = b"G"
SAID_GOODBYE = "it stopped in order (it said goodbye)"
SILENT = (
    f"its connection failed (Connection timed out): no answer for ${KEEPALIVE_ENV} "
    "seconds, its host is silent or the link to it is cut"
)
# A peer of this rank's own executor that is gone: wait this long before
# ending this worker, for the executor's own shutdown (which, in vLLM's abort
# mode, SIGKILLs every worker one after another) to end this one first.
SAME_EXECUTOR_GRACE_S = 0.25

logger = logging.getLogger("vllm.ppspec")


def executor_id() -> str:
    """The process that started this worker (vLLM's executor under its mp
    backend): its pid in this pid namespace, on this boot of this machine."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = socket.gethostname()
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = ""
    return f"{boot} {pid_ns} {os.getppid()}"


class Peers(dict[int, socket.socket]):
    """Every other rank of the PP group -> its connection; ``rank``: this
    rank; ``same_executor``: the ranks this rank's executor started;
    ``addresses``: each peer's address (``host:port`` of its peer watch)."""

    def __init__(
        self,
        rank: int,
        socks: dict[int, socket.socket],
        same_executor: frozenset[int],
        addresses: dict[int, str] | None = None,
    ):
        super().__init__(socks)
        self.rank = rank
        self.same_executor = same_executor
        self.addresses = addresses or {}

    def name(self, rank: int) -> str:
        """``PP rank R at HOST:PORT``: the peer, and the host it is on."""
        where = self.addresses.get(rank)
        return f"PP rank {rank} at {where}" if where else f"PP rank {rank}"


def connect_peers(cpu_group: Any, host: str) -> Peers:
    """One connection to every other rank of ``cpu_group``.

    Collective: one ``all_gather_object``, called by every rank of the group.
    """
    import torch.distributed as dist

    rank = dist.get_rank(cpu_group)
    world = dist.get_world_size(cpu_group)
    total_s = keepalive_s()  # a bad value is refused before any connection
    token = secrets.token_bytes(TOKEN_BYTES)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.bind((host, 0))
    listener.listen(world)
    mine = (host, listener.getsockname()[1], token, executor_id())
    published: list[Any] = [None] * world
    dist.all_gather_object(published, mine, group=cpu_group)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    socks: dict[int, socket.socket] = {}
    try:
        for peer in range(rank + 1, world):  # completes on the peer's backlog
            address = tuple(published[peer][:2])
            sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
            sock.sendall(HELLO.pack(MAGIC, rank, token))
            socks[peer] = sock
        tokens = {r: published[r][2] for r in range(rank)}
        socks.update(accept_lower_ranks(listener, tokens, deadline))
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    finally:
        listener.close()
    for sock in socks.values():
        sock.settimeout(None)
        set_keepalive(sock, total_s)
    same = frozenset(r for r in socks if published[r][3] == mine[3])
    addresses = {r: _address(*published[r][:2]) for r in socks}
    return Peers(rank, socks, same, addresses)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def accept_lower_ranks(
    listener: socket.socket, tokens: dict[int, bytes], deadline: float
) -> dict[int, socket.socket]:
    """Accept one connection from each rank of ``tokens`` (rank -> its token),
    by their hellos, until ``deadline`` (``time.monotonic()``). A connection
    whose hello is not one of them, or repeats a rank already in, or that
    closes first, is closed; one still silent at the end too."""
    accepted: dict[int, socket.socket] = {}
    pending: dict[socket.socket, bytes] = {}
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        try:
            while len(accepted) < len(tokens):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(tokens) - set(accepted))
                    raise TimeoutError(
                        f"vllm-ppspec: PP ranks {missing} did not connect to this rank's "
                        f"peer watch within {CONNECT_TIMEOUT_S:.0f} s"
                    )
                for key, _ in selector.select(left):
                    if key.fileobj is listener:
                        sock, _ = listener.accept()
                        sock.setblocking(False)
                        pending[sock] = b""
                        selector.register(sock, selectors.EVENT_READ)
                        continue
                    sock = key.fileobj  # type: ignore[assignment]
                    try:
                        chunk = sock.recv(HELLO.size - len(pending[sock]))
                    except OSError:
                        chunk = b""
                    data = pending[sock] + chunk
                    if chunk and len(data) < HELLO.size:
                        pending[sock] = data
                        continue
                    selector.unregister(sock)
                    del pending[sock]
                    rank = _claimed_rank(data, tokens, accepted)
                    if rank is None:
                        _close_stray(sock, data)
                    else:
                        sock.setblocking(True)
                        accepted[rank] = sock
        except BaseException:
            for sock in accepted.values():
                sock.close()
            raise
        finally:
            for sock in pending:
                _close_stray(sock, pending[sock])
    return accepted


def _claimed_rank(
    hello: bytes, tokens: dict[int, bytes], accepted: dict[int, socket.socket]
) -> int | None:
    """The rank a complete hello proves, if it may still take its slot."""
    if len(hello) != HELLO.size:
        return None
    magic, rank, token = HELLO.unpack(hello)
    if magic != MAGIC or rank not in tokens or rank in accepted:
        return None
    return rank if secrets.compare_digest(token, tokens[rank]) else None


def _close_stray(sock: socket.socket, received: bytes) -> None:
    try:
        peer = sock.getpeername()
    except OSError:
        peer = "?"
    logger.warning(
        "vllm-ppspec: the PP peer watch closed a connection from %s that is not a "
        "PP peer's (%d bytes received)",
        peer,
        len(received),
    )
    sock.close()


def first_gone(socks: dict[int, socket.socket]) -> tuple[int, str]:
    """Block until a peer's connection ends or says goodbye: (its rank, what
    was seen). Its goodbye byte, if any, is read."""
    with selectors.DefaultSelector() as selector:
        for rank, sock in socks.items():
            selector.register(sock, selectors.EVENT_READ, rank)
        while True:
            for key, _ in selector.select():
                rank = key.data
                try:
                    data = socks[rank].recv(1)
                except BlockingIOError:
                    continue
                except TimeoutError:  # keepalive gave up on the host
                    return rank, SILENT
                except OSError as e:  # reset
                    return rank, f"its connection failed ({e.strerror or e})"
                if data == b"":
                    return rank, "its connection closed"
                if data == GOODBYE:
                    return rank, SAID_GOODBYE
                return rank, f"it sent {data!r}, which is not a goodbye"


# Set by the worker before its runner starts the watch (runner/health/orderly_stop.py).
_HEADLESS = {"node": False}


def set_headless_node(headless: bool) -> None:
    """This worker's executor runs in a headless ``vllm serve`` (its parent
    process): a goodbye from another executor's rank stops it by SIGTERM."""
    _HEADLESS["node"] = headless


class Watch:
    """The watch thread's decisions, and the goodbye this worker sends."""

    def __init__(self, peers: Peers, headless: bool):
        self.peers = peers
        self.headless = headless
        self.parent = os.getppid()  # the process that runs this rank's executor
        self.lock = threading.Lock()
        self.done = False  # the watch acted: nothing more is reported
        self.said_goodbye = False  # this rank stops in order

    def run(self) -> None:
        from vllm_ppspec.runner.health import rank_errors

        live = dict(self.peers)
        while live:
            rank, seen = first_gone(live)
            del live[rank]
            same = rank in self.peers.same_executor
            goodbye = seen == SAID_GOODBYE
            if same and goodbye:
                continue  # the executor stopping that rank stops this one too
            if same:
                time.sleep(SAME_EXECUTOR_GRACE_S)
            with self.lock:
                if self.done:
                    return
                if self.said_goodbye and not same:
                    continue  # this rank stops in order: other nodes stop too
                self.done = True
                if goodbye and self.headless:
                    logger.info(
                        "vllm-ppspec: PP rank %d stopped in order (it said goodbye): "
                        "stopping this node's vLLM (PP rank %d)",
                        rank,
                        self.peers.rank,
                    )
                    stop_this_node(self.parent)
                    return
                what = "a PP peer stopped" if goodbye else "a PP peer died"
                rank_errors.end_worker(RuntimeError(f"{self.peers.name(rank)}: {seen}"), what)

    def say_goodbye(self) -> None:
        """Once: send each peer the goodbye. After it, only a peer of this
        rank's own executor that dies without one is still reported (its
        death is why the executor stops this rank, and vLLM's own teardown
        would wait on it)."""
        with self.lock:
            if self.said_goodbye:
                return
            self.said_goodbye = True
            for sock in self.peers.values():
                try:
                    sock.send(GOODBYE, socket.MSG_DONTWAIT)
                except OSError:
                    pass  # that peer is gone already


def stop_this_node(parent: int) -> None:
    """What stopping a headless ``vllm serve`` does: SIGTERM to it (``parent``,
    while it is still this process's parent)."""
    if os.getppid() == parent:
        os.kill(parent, signal.SIGTERM)


_WATCH: list[Watch] = []


def watch_pp_peers(cpu_group: Any, host: str) -> list[int]:
    """Connect to every PP peer (collective, see :func:`connect_peers`) and
    watch them from a thread (see the module docstring). Returns the peers' ranks."""
    watch = Watch(connect_peers(cpu_group, host), _HEADLESS["node"])
    _WATCH[:] = [watch]
    threading.Thread(target=watch.run, daemon=True, name="ppspec-peer-watch").start()
    return sorted(watch.peers)


def say_goodbye() -> None:
    """This worker stops in order: stop watching, send each peer a goodbye."""
    for watch in _WATCH:
        watch.say_goodbye()
