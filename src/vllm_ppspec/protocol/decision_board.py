"""Each rank's start-up decision, posted on the world group's store and read by the others.

The deployment check (``patches/config/deployment_check.py``) posts one dict of
strings per rank under ``vllm_ppspec/deployment/decision/<rank>`` in the
``torch.distributed`` store that vLLM's world group was built on. Posting never
waits. Two kinds of rank read the board:

* a rank the plugin serves (:func:`await_all`) polls until every rank posted or
  one posted something else, then returns what it saw;
* a rank that posted but where the plugin does not act (:func:`watch`) does
  not wait: a daemon thread waits for a refusal (:func:`refuse` writes it once,
  the first rank's text wins), acknowledges it, and calls back. A rank without
  the plugin posts nothing: its absence is what names it.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Callable
from typing import Any

PREFIX = "vllm_ppspec/deployment/"
VERDICT = "verdict"
POLL_S = 0.05
ACK_WAIT_S = 3.0  # a refusing rank waits this long for the watchers to read it


def board(store: Any) -> Any:
    """This check's view of ``store`` (a new client of it: usable from a thread)."""
    import torch.distributed as dist

    return dist.PrefixStore(PREFIX, store.clone())


def default_store() -> Any:
    """The store of torch's default process group (vLLM's world group)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def post(board_: Any, rank: int, decision: dict[str, str]) -> None:
    board_.set(f"decision/{rank}", json.dumps(decision))


def read(board_: Any, world_size: int) -> dict[int, dict[str, str]]:
    """The decisions posted so far, by rank."""
    seen = {}
    for rank in range(world_size):
        key = f"decision/{rank}"
        if board_.check([key]):
            seen[rank] = json.loads(board_.get(key))
    return seen


def verdict(board_: Any) -> str | None:
    return board_.get(VERDICT).decode() if board_.check([VERDICT]) else None


def await_all(
    board_: Any,
    world_size: int,
    differs: Callable[[dict[int, dict[str, str]]], bool],
    timeout: float,
) -> tuple[dict[int, dict[str, str]], str | None]:
    """Poll until every rank posted, ``differs(seen)`` holds, another rank wrote
    a refusal, or ``timeout`` passed. Returns (decisions seen, refusal or None)."""
    deadline = time.monotonic() + timeout
    while True:
        refusal = verdict(board_)
        seen = read(board_, world_size)
        if refusal is not None or len(seen) == world_size or differs(seen):
            return seen, refusal
        if time.monotonic() >= deadline:
            return seen, None
        time.sleep(POLL_S)


def refuse(board_: Any, text: str, watchers: list[int]) -> str:
    """Write the refusal (the first one written wins; returned), then wait up to
    :data:`ACK_WAIT_S` for ``watchers`` to read it before this rank ends (rank
    0 holds the store)."""
    won = board_.compare_set(VERDICT, "", text).decode()
    deadline = time.monotonic() + ACK_WAIT_S
    keys = [f"seen/{r}" for r in watchers]
    while keys and not board_.check(keys) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return won


def watch(board_: Any, rank: int, timeout: float, on_refusal: Callable[[str], None]) -> Any:
    """A daemon thread that waits up to ``timeout`` for a refusal, acknowledges
    it and calls ``on_refusal`` with it. Returns the thread."""

    def run() -> None:
        try:
            board_.wait([VERDICT], datetime.timedelta(seconds=timeout))
            text = board_.get(VERDICT).decode()
            board_.set(f"seen/{rank}", "1")
        except Exception:  # noqa: BLE001 - no refusal in time, or the store is gone: nothing to do
            return
        on_refusal(text)

    thread = threading.Thread(target=run, daemon=True, name="ppspec-deployment-watch")
    thread.start()
    return thread
