"""Where a rank's wall time goes, measured inside the runner.

vLLM's workers spin while they wait, so CPU time cannot tell how busy a stage
is. The benchmark reads these (``vllm_ppspec_tools.fixtures.probes.runner_clocks``):

* ``forward_s``: seconds in the target model's forward;
* ``step_s``: seconds inside ``execute_model`` and ``sample_tokens`` (the
  forward included), less ``wait_s``;
* ``wait_s``: seconds waiting for a round from the last rank;
* ``steps``: ``execute_model`` calls with tokens to compute.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Clocks:
    def __init__(self) -> None:
        self.forward_s = 0.0
        self.total_step_s = 0.0
        self.wait_s = 0.0
        self.steps = 0

    @property
    def step_s(self) -> float:
        return self.total_step_s - self.wait_s

    @contextmanager
    def timing(self, clock: str) -> Iterator[None]:
        """Add the block's wall time to ``forward_s``, ``total_step_s`` or ``wait_s``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, clock, getattr(self, clock) + time.perf_counter() - start)
