"""A dead PP peer ends this worker, on one host or across hosts; a peer that
stops in order says goodbye first.

A PP peer that dies (killed, out of memory, its host gone) leaves the other
ranks blocked in a pipeline receive or a round that never arrives; vLLM's
executor on another host never learns of it. Each rank therefore holds one TCP
connection to every PP peer (``peer_links.py``), on which nothing is sent but
one goodbye byte, and a thread waits on all of them (``selectors``: no limit
on descriptor numbers, vLLM raises the process's limit). When a peer process
ends, however it ends, its kernel closes its sockets and this end reads EOF or
a reset at once; a peer host that vanishes without closing them is caught by
TCP keepalive. ``VLLM_PPSPEC_PEER_KEEPALIVE_S`` (a host-local setting, whole
seconds, at least 4, default 15) is the time from the last sign of a silent
peer to it being declared gone: a probe every ``interval = max(1, total //
10)`` s of silence (1 s by default) and ``TCP_USER_TIMEOUT`` of ``total``. A
link that stalls and comes back is answered at the next probe: a stall shorter
than ``total - 2 * interval`` (13 s by default) ends nothing, a peer silent
for good is gone ``total`` to ``total + interval`` s after its last sign
(``keepalive.py``). A peer whose process is stopped or frozen keeps its
kernel answering the keepalive: the same thread therefore sends each peer a
UDP beat every interval and declares a peer none of whose beats arrived for
``total`` seconds gone (``heartbeat.py``); where a peer is on another
executor, a guardian process ends this worker if this thread stops beating.
A gone peer ends this worker (``rank_errors.end_worker``, naming the peer's
rank and address) and vLLM stops the engine on this host.

An orderly stop: a worker that vLLM shuts down (its executor stops it, or it
gets SIGTERM) calls :func:`say_goodbye` (``runner/health/orderly_stop.py``):
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
the first. :func:`stop_this_node` signals the parent process.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import threading
import time
from typing import Any

from vllm_ppspec.runner.health.heartbeat import Heartbeat
from vllm_ppspec.runner.health.keepalive import KEEPALIVE_ENV
from vllm_ppspec.runner.health.peer_links import Peers, connect_peers

GOODBYE = b"G"
SAID_GOODBYE = "it stopped in order (it said goodbye)"
SILENT = (
    f"its connection failed (Connection timed out): no answer for ${KEEPALIVE_ENV} "
    "seconds, its host is silent or the link to it is cut"
)
SILENT_PREFIX = "no heartbeat for"  # heartbeat.silent_message
# A peer of this rank's own executor that is gone: wait this long before
# ending this worker, for the executor's own shutdown (which, in vLLM's abort
# mode, SIGKILLs every worker one after another) to end this one first.
SAME_EXECUTOR_GRACE_S = 0.25

logger = logging.getLogger("vllm.ppspec")


def first_gone(
    socks: dict[int, socket.socket], heartbeat: Heartbeat | None = None
) -> tuple[int, str]:
    """Block until a peer's connection ends or says goodbye, or (with a
    ``heartbeat``) its beats stop for the bound: (its rank, what was seen).
    Its goodbye byte, if any, is read. Meanwhile the heartbeat beats: the
    datagrams that arrived are read before any peer is judged silent, so a
    wait of this thread's own is not taken for a peer's silence."""
    with selectors.DefaultSelector() as selector:
        for rank, sock in socks.items():
            selector.register(sock, selectors.EVENT_READ, rank)
        if heartbeat is not None:
            selector.register(heartbeat.sock, selectors.EVENT_READ, None)
        while True:
            timeout = None
            if heartbeat is not None:
                now = time.monotonic()
                if heartbeat.due(now):
                    heartbeat.send(now)
                timeout = heartbeat.timeout(now, socks)
            events = selector.select(timeout)
            if heartbeat is not None:
                heartbeat.receive(time.monotonic())
            for key, _ in events:
                rank = key.data
                if rank is None:
                    continue  # the beats, read above
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
            if heartbeat is not None:
                silent = heartbeat.silent(time.monotonic(), socks)
                if silent is not None:
                    return silent


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
        try:
            self._watch()
        finally:
            if self.peers.heartbeat is not None:
                self.peers.heartbeat.close()  # the guardian ends with the watch

    def _watch(self) -> None:
        from vllm_ppspec.runner.health import rank_errors

        live = dict(self.peers)
        while live:
            rank, seen = first_gone(live, self.peers.heartbeat)
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
                if seen.startswith(SILENT_PREFIX):
                    what = "a PP peer went silent"
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
    heartbeat = watch.peers.heartbeat
    if heartbeat is not None and set(watch.peers) - watch.peers.same_executor:
        heartbeat.start_guardian()  # a peer on another executor cannot end this worker
    threading.Thread(target=watch.run, daemon=True, name="ppspec-peer-watch").start()
    return sorted(watch.peers)


def say_goodbye() -> None:
    """This worker stops in order: stop watching, send each peer a goodbye."""
    for watch in _WATCH:
        watch.say_goodbye()
