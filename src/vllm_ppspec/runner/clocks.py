"""Measure where a rank's wall time goes, inside the runner.

vLLM's workers spin while they wait, so CPU time cannot tell how busy a stage
is. The benchmark reads these (``vllm_ppspec_tools.fixtures.probes.runner_clocks``):

* ``forward_s``: seconds in the target model's forward;
* ``draft_s``: seconds in vLLM's ``propose_draft_token_ids`` (the drafter's
  passes; the last rank);
* ``step_s``: seconds inside ``execute_model`` and ``sample_tokens`` (the
  forward included), less ``wait_s``;
* ``wait_s``: seconds waiting for a round from the last rank;
* ``travel_wait_s``: the part of ``wait_s`` after the last rank had sent the
  round (its wall clock against this rank's: exact on one machine, off by
  the clocks' offset across hosts); the rest is the pipeline's own wait;
* ``rounds``: rounds received (non-last ranks);
* ``steps``: ``execute_model`` calls with tokens to compute.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_ppspec.protocol.rounds import Round


class Clocks:
    def __init__(self) -> None:
        self.forward_s = 0.0
        self.draft_s = 0.0
        self.total_step_s = 0.0
        self.wait_s = 0.0
        self.travel_wait_s = 0.0
        self.rounds = 0
        self.steps = 0

    def received(self, rnd: Round) -> None:
        """A non-last rank got a round."""
        self.travel_wait_s += rnd.travel_wait_s
        self.rounds += 1

    @property
    def step_s(self) -> float:
        return self.total_step_s - self.wait_s

    @contextmanager
    def timing(self, clock: str) -> Iterator[None]:
        """Add the block's wall time to ``forward_s``, ``draft_s``, ``total_step_s`` or
        ``wait_s``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, clock, getattr(self, clock) + time.perf_counter() - start)


class WorkerClocks:
    """Worker mixin: this rank's clocks by vLLM's ``collective_rpc``
    (``POST /collective_rpc {"method": "ppspec_clocks"}`` on a server started
    with ``VLLM_SERVER_DEV_MODE=1``; scripts/bench_two_hosts.py reads them)."""

    model_runner: Any

    def ppspec_clocks(self) -> dict[str, float]:
        clocks = getattr(self.model_runner, "ppspec_clocks", None)
        if clocks is None:
            return {}
        return {
            "forward_s": float(clocks.forward_s),
            "draft_s": float(clocks.draft_s),
            "step_s": float(clocks.step_s),
            "wait_s": float(clocks.wait_s),
            "travel_wait_s": float(clocks.travel_wait_s),
            "rounds": float(clocks.rounds),
            "steps": float(clocks.steps),
        }
