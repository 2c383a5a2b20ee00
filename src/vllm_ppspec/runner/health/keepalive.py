"""How long a PP peer may be silent: ``VLLM_PPSPEC_PEER_KEEPALIVE_S``.

The peer watch's connections (``peer_watch.py``) carry nothing but a goodbye,
so a peer host that vanishes without closing them (its link cut, its power
gone) is seen by TCP keepalive, and a peer whose process is stopped or
frozen (its kernel still answers) by its missing UDP beats
(``heartbeat.py``). The one setting is the time from a peer's last sign of
life to it being declared gone, for both; the probes, the user timeout and
the beat interval are derived from it, and so are the bounds the docs state
(:func:`keepalive_bounds`; docs/reliability.md, "Across hosts").
"""

from __future__ import annotations

import os
import socket

KEEPALIVE_ENV = "VLLM_PPSPEC_PEER_KEEPALIVE_S"
# A stall of 10 s (a switch failover, a live migration) must end nothing, and a
# silent host must end the engine on every other host within 30 s, its
# teardown included (docs/reliability.md, "Across hosts"): 15 s sits between.
DEFAULT_KEEPALIVE_S = 15
MIN_KEEPALIVE_S = 4
# Linux's TCP_USER_TIMEOUT (18): not in every Python's socket module.
TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)


def keepalive_interval(total_s: int) -> int:
    """Seconds between keepalive probes (and of silence before the first)."""
    return max(1, total_s // 10)


def keepalive_options(total_s: int) -> list[tuple[int, int]]:
    """TCP options (option, value) that declare a silent peer gone ``total_s``
    seconds after its last sign of life: a probe every interval of silence,
    and the user timeout (ms) that ends the connection at the first probe
    timer at or after ``total_s`` s without an answer. ``TCP_KEEPCNT`` gives
    the same bound (within one interval) where the user timeout is ignored."""
    interval = keepalive_interval(total_s)
    return [
        (socket.TCP_KEEPIDLE, interval),
        (socket.TCP_KEEPINTVL, interval),
        (socket.TCP_KEEPCNT, max(1, total_s // interval - 1)),
        (TCP_USER_TIMEOUT, total_s * 1000),
    ]


def keepalive_bounds(total_s: int) -> tuple[int, int]:
    """(the longest stall that ends nothing, the latest a silent peer is
    declared gone), in seconds after the stall began or the last sign of life.
    A stall is survived when a probe goes out after it and is answered before
    ``total_s``: the probes are one interval apart."""
    interval = keepalive_interval(total_s)
    return total_s - 2 * interval, total_s + interval


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


def set_keepalive(sock: socket.socket, total_s: int | None = None) -> None:
    """Set the options on ``sock`` (``total_s``, or the variable's value)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in keepalive_options(keepalive_s() if total_s is None else total_s):
        sock.setsockopt(socket.IPPROTO_TCP, option, value)
