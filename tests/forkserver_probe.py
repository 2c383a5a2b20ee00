"""A job for tests/test_forkserver_preload.py: what the forked child starts with."""

from __future__ import annotations

import gc
import json
import sys
import weakref


class _Node:
    pass


def _cycle_collected() -> bool:
    """Whether ``gc.collect()`` frees a reference cycle made here."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    alive = weakref.ref(a)
    del a, b
    gc.collect()
    return alive() is None


def main() -> None:
    from vllm_ppspec_tools.fixtures.forkserver_preload import WORKER_PRELOAD

    gc.disable()  # no automatic collection between the cycle and the call
    print(
        json.dumps(
            {
                "frozen": gc.get_freeze_count(),
                "imported": [m for m in WORKER_PRELOAD if m in sys.modules],
                "forced_collection": _cycle_collected(),
            }
        )
    )
