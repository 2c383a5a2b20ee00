"""A job for tests/test_forkserver_preload.py: what the forked child starts with."""

from __future__ import annotations

import gc
import json
import sys


def main() -> None:
    from vllm_ppspec_tools.fixtures.forkserver_preload import WORKER_PRELOAD

    print(
        json.dumps(
            {
                "frozen": gc.get_freeze_count(),
                "imported": [m for m in WORKER_PRELOAD if m in sys.modules],
            }
        )
    )
