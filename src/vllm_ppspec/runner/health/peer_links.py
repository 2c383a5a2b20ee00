"""Connect every pair of PP ranks once: one TCP connection per pair, proven by a hello.

At runner set-up every PP rank listens on ``host`` (an ephemeral port), opens
a UDP socket there for its heartbeat (``heartbeat.py``), and the ranks
exchange ``(host, port, token, executor, beat port)``: one
``all_gather_object`` on the PP group's gloo group, every rank, once. The
token is 16 random bytes per rank; ``executor`` names the vLLM process that
started the rank (:func:`executor_id`). The lower rank of each pair
connects, from ``host``, and sends a hello: a magic, its rank and its token.
The higher rank accepts only a hello from a lower rank, with that rank's
token, once per rank, within :data:`CONNECT_TIMEOUT_S`; any other connection
(another rank number, garbage, closed early, silent) is closed and takes no
slot. The listener is closed when every lower rank is in. The connections
get the keepalive of ``keepalive.py``; ``peer_watch.py`` watches them and
the beats.

Process ids are not used to judge a peer (they mean nothing across hosts or
pid namespaces). Only the parent's is read: :func:`executor_id` puts it with
the boot id and the pid namespace, to tell whether two ranks were started by
the same process.
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import socket
import struct
import time
from pathlib import Path
from typing import Any

from vllm_ppspec.runner.health.heartbeat import Heartbeat
from vllm_ppspec.runner.health.keepalive import keepalive_s, set_keepalive

CONNECT_TIMEOUT_S = 30.0
TOKEN_BYTES = 16
HELLO = struct.Struct(f"!4sI{TOKEN_BYTES}s")  # magic, the connecting rank, its token
MAGIC = b"PPSW"

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
    ``addresses``: each peer's address (``host:port`` of its peer watch);
    ``heartbeat``: this rank's beats to them and their silence (None: the
    connections alone are watched)."""

    def __init__(
        self,
        rank: int,
        socks: dict[int, socket.socket],
        same_executor: frozenset[int],
        addresses: dict[int, str] | None = None,
        heartbeat: Heartbeat | None = None,
    ):
        super().__init__(socks)
        self.rank = rank
        self.same_executor = same_executor
        self.addresses = addresses or {}
        self.heartbeat = heartbeat

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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen(world)
    beats = socket.socket(family, socket.SOCK_DGRAM)
    beats.bind((host, 0))
    mine = (host, listener.getsockname()[1], token, executor_id(), beats.getsockname()[1])
    published: list[Any] = [None] * world
    dist.all_gather_object(published, mine, group=cpu_group)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    socks: dict[int, socket.socket] = {}
    try:
        for peer in range(rank + 1, world):  # completes on the peer's backlog
            address = tuple(published[peer][:2])
            sock = socket.create_connection(
                address, timeout=CONNECT_TIMEOUT_S, source_address=(host, 0)
            )
            sock.sendall(HELLO.pack(MAGIC, rank, token))
            socks[peer] = sock
        tokens = {r: published[r][2] for r in range(rank)}
        socks.update(accept_lower_ranks(listener, tokens, deadline))
    except BaseException:
        for sock in socks.values():
            sock.close()
        beats.close()
        raise
    finally:
        listener.close()
    for sock in socks.values():
        sock.settimeout(None)
        set_keepalive(sock, total_s)
    same = frozenset(r for r in socks if published[r][3] == mine[3])
    addresses = {r: _address(*published[r][:2]) for r in socks}
    heartbeat = Heartbeat(
        rank,
        token,
        beats,
        {r: ((published[r][0], published[r][4]), published[r][2]) for r in socks},
        float(total_s),
    )
    return Peers(rank, socks, same, addresses, heartbeat)


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
