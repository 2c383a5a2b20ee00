"""A dead PP peer ends this worker, on one host or across hosts.

A PP peer that dies (killed, out of memory, its host gone) leaves the other
ranks blocked in a pipeline receive or a round collective that never returns;
vLLM's executor on another host never learns of it. Each rank therefore holds
one TCP connection to every PP peer, on which nothing is ever sent:

* at runner set-up every PP rank listens on ``host`` (an ephemeral port) and
  the ranks exchange ``(host, port)``: one ``all_gather_object`` on the PP
  group's gloo group, every rank, once;
* the lower rank of each pair connects and sends its rank; the higher accepts;
* a thread waits on all of them. When a peer process ends, however it ends,
  its kernel closes its sockets and this end reads EOF or a reset at once; a
  peer host that vanishes without closing them is caught by TCP keepalive
  (idle 3 s, then 3 probes 1 s apart: gone within about 6 s). Either way this worker ends
  (``rank_errors.end_worker``) and vLLM stops the engine on this host.

Process ids are not used: they mean nothing across hosts or pid namespaces
(the watcher before this one checked ``os.kill(pid, 0)`` and, across hosts,
both killed healthy engines and missed dead peers).
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from typing import Any

CONNECT_TIMEOUT_S = 30.0
KEEPALIVE = ((socket.TCP_KEEPIDLE, 3), (socket.TCP_KEEPINTVL, 1), (socket.TCP_KEEPCNT, 3))


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in KEEPALIVE:
        sock.setsockopt(socket.IPPROTO_TCP, option, value)


def connect_peers(cpu_group: Any, host: str) -> dict[int, socket.socket]:
    """One connection to every other rank of ``cpu_group`` (rank -> socket).

    Collective: one ``all_gather_object``, called by every rank of the group.
    """
    import torch.distributed as dist

    rank = dist.get_rank(cpu_group)
    world = dist.get_world_size(cpu_group)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.bind((host, 0))
    listener.listen(world)
    addresses: list[Any] = [None] * world
    dist.all_gather_object(addresses, (host, listener.getsockname()[1]), group=cpu_group)
    peers: dict[int, socket.socket] = {}
    try:
        for peer in range(rank + 1, world):  # completes on the peer's backlog
            sock = socket.create_connection(tuple(addresses[peer]), timeout=CONNECT_TIMEOUT_S)
            sock.sendall(struct.pack("!i", rank))
            peers[peer] = sock
        listener.settimeout(CONNECT_TIMEOUT_S)
        while len(peers) < world - 1:
            sock, _ = listener.accept()
            sock.settimeout(CONNECT_TIMEOUT_S)
            (peer,) = struct.unpack("!i", _read_exactly(sock, 4))
            peers[peer] = sock
    finally:
        listener.close()
    for sock in peers.values():
        sock.settimeout(None)
        _keepalive(sock)
    return peers


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("a PP peer closed its connection during set-up")
        data += chunk
    return data


def first_gone(peers: dict[int, socket.socket]) -> tuple[int, str]:
    """Block until a peer's connection ends; (its rank, what was seen)."""
    by_fd = {sock.fileno(): rank for rank, sock in peers.items()}
    while True:
        readable, _, broken = select.select(list(by_fd), [], list(by_fd))
        for fd in broken + readable:
            rank = by_fd[fd]
            try:
                if peers[rank].recv(1, socket.MSG_PEEK) == b"":
                    return rank, "its connection closed"
            except OSError as e:  # reset, or keepalive gave up on the host
                return rank, f"its connection failed ({e.strerror or e})"


def watch_pp_peers(cpu_group: Any, host: str) -> list[int]:
    """Connect to every PP peer (collective, see :func:`connect_peers`) and end
    this worker when one is gone. Returns the peers' ranks."""
    from vllm_ppspec.runner import rank_errors

    peers = connect_peers(cpu_group, host)

    def watch() -> None:
        rank, seen = first_gone(peers)
        rank_errors.end_worker(RuntimeError(f"PP rank {rank}: {seen}"), "a PP peer died")

    threading.Thread(target=watch, daemon=True, name="ppspec-peer-watch").start()
    return sorted(peers)
