"""A dead PP peer ends this worker, on one host or across hosts.

A PP peer that dies (killed, out of memory, its host gone) leaves the other
ranks blocked in a pipeline receive or a round that never arrives; vLLM's
executor on another host never learns of it. Each rank therefore holds one TCP
connection to every PP peer, on which nothing is ever sent:

* at runner set-up every PP rank listens on ``host`` (an ephemeral port) and
  the ranks exchange ``(host, port, token)``: one ``all_gather_object`` on the
  PP group's gloo group, every rank, once. The token is 16 random bytes per
  rank;
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
  seconds, at least 4, default 6) is the time from the last sign of a silent
  peer to it being declared gone: idle ``total - 3 * interval``, then 3
  probes ``interval = max(1, total // 6)`` apart (default: idle 3 s, 3 probes
  1 s apart). Either way this worker ends (``rank_errors.end_worker``) and
  vLLM stops the engine on this host.

Process ids are not used: they mean nothing across hosts or pid namespaces
(the watcher before this one checked ``os.kill(pid, 0)`` and, across hosts,
both killed healthy engines and missed dead peers).
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import socket
import struct
import threading
import time
from typing import Any

CONNECT_TIMEOUT_S = 30.0
KEEPALIVE_ENV = "VLLM_PPSPEC_PEER_KEEPALIVE_S"
DEFAULT_KEEPALIVE_S = 6
MIN_KEEPALIVE_S = 4
KEEPALIVE_PROBES = 3
TOKEN_BYTES = 16
HELLO = struct.Struct(f"!4sI{TOKEN_BYTES}s")  # magic, the connecting rank, its token
MAGIC = b"PPSW"

logger = logging.getLogger("vllm.ppspec")


def keepalive_options(total_s: int) -> list[tuple[int, int]]:
    """TCP keepalive options (option, seconds or count) that declare a silent
    peer gone ``total_s`` seconds after its last sign of life."""
    interval = max(1, total_s // 6)
    idle = total_s - KEEPALIVE_PROBES * interval
    return [
        (socket.TCP_KEEPIDLE, idle),
        (socket.TCP_KEEPINTVL, interval),
        (socket.TCP_KEEPCNT, KEEPALIVE_PROBES),
    ]


def keepalive_s() -> int:
    """``VLLM_PPSPEC_PEER_KEEPALIVE_S``, checked (ValueError naming it)."""
    raw = os.environ.get(KEEPALIVE_ENV, "").strip()
    if not raw:
        return DEFAULT_KEEPALIVE_S
    try:
        total = int(raw)
    except ValueError:
        total = 0
    if total < MIN_KEEPALIVE_S:
        raise ValueError(
            f"${KEEPALIVE_ENV}={raw!r}: give whole seconds, at least {MIN_KEEPALIVE_S} "
            f"(default {DEFAULT_KEEPALIVE_S})"
        )
    return total


def _keepalive(sock: socket.socket, total_s: int | None = None) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in keepalive_options(keepalive_s() if total_s is None else total_s):
        sock.setsockopt(socket.IPPROTO_TCP, option, value)


def connect_peers(cpu_group: Any, host: str) -> dict[int, socket.socket]:
    """One connection to every other rank of ``cpu_group`` (rank -> socket).

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
    mine = (host, listener.getsockname()[1], token)
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
        _keepalive(sock, total_s)
    return socks


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
    """Block until a peer's connection ends; (its rank, what was seen)."""
    with selectors.DefaultSelector() as selector:
        for rank, sock in socks.items():
            selector.register(sock, selectors.EVENT_READ, rank)
        while True:
            for key, _ in selector.select():
                rank = key.data
                try:
                    if socks[rank].recv(1, socket.MSG_PEEK) == b"":
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
