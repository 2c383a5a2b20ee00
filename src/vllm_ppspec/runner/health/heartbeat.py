"""A frozen PP peer is seen: every rank beats from its peer watch's thread.

TCP keepalive is answered by a peer's kernel, and a kernel answers for a
process that is stopped (SIGSTOP), wedged or held by a debugger as well as
for a running one: such a peer kept every request pending and ``/health`` at
200 (issue 39). So each rank's watch thread (``peer_watch.py``), not its step
loop, sends every PP peer a beat every :func:`beat_interval` seconds, and a
peer none of whose beats arrived for ``VLLM_PPSPEC_PEER_KEEPALIVE_S`` seconds
(``keepalive.py``: the one bound on a peer's silence, default 15) is declared
gone like a peer whose connection closed. The main thread's long steps do not
delay the beats: torch's operators release the GIL, and the watch thread only
needs it for microseconds each second.

The beats are UDP datagrams (magic, the sender's rank, the sender's token:
:data:`BEAT`), to the port each rank publishes with its watch's address
(``peer_links.connect_peers``). Not bytes on the watch's TCP connection: data
that a stalled link holds is retransmitted by TCP with exponential backoff,
so after an 8 s stall TCP could deliver the next beat 16 s after the last
one, and a stall the keepalive rides out would end the engine. A datagram
sent after the stall arrives at once: a stall shorter than ``T - 2 *
interval`` (13 s by default) ends nothing, as with the keepalive. A datagram
that does not carry a peer's rank and token is dropped. A peer none of whose
beats ever arrived is named so (UDP to its port blocked?).

A rank whose own watch thread stops (SIGSTOP stops every thread of a process)
cannot end itself, and across hosts nothing else on its host would: its
executor waits on it. So, where a PP peer belongs to another executor, the
watch starts a guardian (``guardian.py``), a small child process that the
watch thread feeds one byte per beat over a pipe; fed nothing for ``T + 2 *
interval`` seconds (its peers have declared it gone by then), it SIGKILLs the worker,
and vLLM's executor on that host sees its worker die and stops the engine
there. The guardian exits when the worker does (the pipe closes).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from vllm_ppspec.runner.health.keepalive import KEEPALIVE_ENV, keepalive_interval

BEAT = struct.Struct("!4sI16s")  # magic, the sending rank, its token
BEAT_MAGIC = b"PPSB"
GUARDIAN = Path(__file__).with_name("guardian.py")

logger = logging.getLogger("vllm.ppspec")


def beat_interval(bound_s: float) -> float:
    """Seconds between beats: the keepalive's probe interval (1 s by default)."""
    return float(keepalive_interval(int(bound_s)))


def silent_message(bound_s: float, ever_heard: bool, beat_port: int | None = None) -> str:
    """What a survivor says of a peer whose beats stopped."""
    said = (
        f"no heartbeat for {bound_s:.0f} s (${KEEPALIVE_ENV}): its worker is stopped or "
        "frozen, its host is silent or the link to it is cut"
    )
    if not ever_heard:
        where = f" (UDP port {beat_port})" if beat_port else ""
        said += (
            f"; none of its beats ever arrived: are UDP datagrams to its peer watch{where} blocked?"
        )
    return said


class Silence:
    """When each peer was last heard; which have been silent over the bound.

    Every peer counts as heard when the watch starts (every rank starts its
    watch in the same collective)."""

    def __init__(self, ranks: Iterable[int], bound_s: float, now: float):
        self.bound_s = bound_s
        self.last = dict.fromkeys(ranks, now)
        self.ever: set[int] = set()

    def heard(self, rank: int, now: float) -> None:
        if rank in self.last:
            self.last[rank] = max(self.last[rank], now)
            self.ever.add(rank)

    def silent(self, now: float, among: Iterable[int] | None = None) -> list[int]:
        """The ranks (of ``among``, default all) silent for more than the bound."""
        ranks = self.last if among is None else [r for r in among if r in self.last]
        return sorted(r for r in ranks if now - self.last[r] > self.bound_s)

    def next_deadline(self, among: Iterable[int] | None = None) -> float:
        """The time at which the next of them would be silent over the bound."""
        ranks = self.last if among is None else [r for r in among if r in self.last]
        return min((self.last[r] + self.bound_s for r in ranks), default=float("inf"))


class Heartbeat:
    """This rank's beats: its UDP socket (bound where its watch listens), each
    peer's beat address and token, the silence of each peer, the guardian."""

    def __init__(
        self,
        rank: int,
        token: bytes,
        sock: socket.socket,
        peers: dict[int, tuple[tuple[str, int], bytes]],
        bound_s: float,
        now: float | None = None,
    ):
        """``peers``: rank -> (its beat address, its token)."""
        self.rank = rank
        self.sock = sock
        self.sock.setblocking(False)
        self.peers = peers
        self.beat = BEAT.pack(BEAT_MAGIC, rank, token)
        self.bound_s = bound_s
        self.interval = beat_interval(bound_s)
        self.silence = Silence(peers, bound_s, time.monotonic() if now is None else now)
        self.next_beat = 0.0
        self.guardian_fd: int | None = None
        self.guardian: subprocess.Popen[bytes] | None = None

    def due(self, now: float) -> bool:
        return now >= self.next_beat

    def send(self, now: float) -> None:
        """One beat to every peer (and the guardian); the next is due an interval later."""
        for address, _ in self.peers.values():
            try:
                self.sock.sendto(self.beat, address)
            except OSError:
                pass  # unreachable for now: its silence is judged on its side
        if self.guardian_fd is not None:
            try:
                os.write(self.guardian_fd, b".")
            except OSError:
                pass  # full (the guardian stopped reading) or gone
        self.next_beat = now + self.interval

    def receive(self, now: float) -> list[int]:
        """Read every datagram waiting; the ranks whose valid beats arrived."""
        heard: list[int] = []
        while True:
            try:
                data = self.sock.recv(BEAT.size + 1)
            except (BlockingIOError, InterruptedError):
                return heard
            except OSError:  # e.g. an ICMP error queued for an earlier send
                continue
            rank = self.sender(data)
            if rank is not None:
                self.silence.heard(rank, now)
                heard.append(rank)

    def sender(self, data: bytes) -> int | None:
        """The peer a datagram is a beat of, or None."""
        if len(data) != BEAT.size:
            return None
        magic, rank, token = BEAT.unpack(data)
        peer = self.peers.get(rank)
        if magic != BEAT_MAGIC or peer is None or token != peer[1]:
            return None
        return rank

    def timeout(self, now: float, among: Iterable[int]) -> float:
        """How long the watch may wait for its sockets before acting."""
        return max(0.0, min(self.next_beat, self.silence.next_deadline(among)) - now)

    def silent(self, now: float, among: Iterable[int]) -> tuple[int, str] | None:
        """The first peer of ``among`` silent over the bound, and what to say of it."""
        gone = self.silence.silent(now, among)
        if not gone:
            return None
        rank = gone[0]
        port = self.peers[rank][0][1]
        return rank, silent_message(self.bound_s, rank in self.silence.ever, port)

    def guardian_bound_s(self) -> float:
        """How long the guardian waits: after the peers' bound (they name this
        rank silent first), the beat they may have missed, and one more."""
        return self.bound_s + 2 * self.interval

    def start_guardian(self) -> None:
        """The guardian of this worker (see the module docstring)."""
        read_fd, write_fd = os.pipe()
        try:
            self.guardian = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    str(GUARDIAN),
                    str(os.getpid()),
                    str(self.guardian_bound_s()),
                    str(self.rank),
                    str(read_fd),
                ],  # fmt: skip
                pass_fds=(read_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of the terminal's group is not its
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        os.set_blocking(write_fd, False)
        self.guardian_fd = write_fd

    def close(self) -> None:
        """The watch ends: the guardian ends with it (its pipe closes)."""
        if self.guardian_fd is not None:
            os.close(self.guardian_fd)
            self.guardian_fd = None
