"""Compare a dict of strings across ranks at start-up: a monitored barrier, then one gather.

Both start-up checks use it: the deployment check of who serves
(``patches/config/deployment_check.py``, every rank of the world group) and the
runner's check that the PP ranks run the plugin the same way
(``runner/health/startup_check.py``). Every rank of ``group`` calls
:func:`gather` once, in the same place: ``monitored_barrier`` (gloo) with a
timeout, then ``all_gather_object``. Every rank then holds the same list and
reaches the same verdict with :func:`differences`.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch.distributed as dist

TIMEOUT_ENV = "VLLM_PPSPEC_STARTUP_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0


class RankMissingError(RuntimeError):
    """A rank of the group did not reach the barrier within the timeout (torch's
    message names it)."""


def host_label() -> str:
    """This rank's host as the start-up checks' messages name it: its hostname,
    and ``VLLM_HOST_IP`` where set."""
    import socket

    ip = os.environ.get("VLLM_HOST_IP")
    return socket.gethostname() + (f" ({ip})" if ip else "")


def timeout_s() -> float:
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def gather(group: Any, mine: dict[str, str], timeout: float) -> list[dict[str, str]]:
    """Every rank's ``mine``, in rank order. Collective on ``group`` (gloo): a
    ``monitored_barrier`` (RankMissingError past ``timeout``), then an
    ``all_gather_object``."""
    try:
        dist.monitored_barrier(
            group=group, timeout=datetime.timedelta(seconds=timeout), wait_all_ranks=True
        )
    except RuntimeError as e:
        raise RankMissingError(str(e)) from e
    prints: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(prints, mine, group=group)
    return prints


def differences(prints: list[dict[str, str]], ignored: tuple[str, ...] = ()) -> list[str]:
    """One line per field that is not the same on every rank (absent: '<unset>'),
    fields in ``ignored`` left out (where a rank runs, posted for the messages)."""
    keys = sorted({k for p in prints for k in p} - set(ignored))
    lines = []
    for key in keys:
        values = [p.get(key, "<unset>") for p in prints]
        if len(set(values)) > 1:
            per_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            lines.append(f"{key} ({per_rank})")
    return lines
