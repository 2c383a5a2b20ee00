"""The runner's mode: which path every step takes, chosen once at set-up.

* ``OFF``: PP = 1, or no speculative config. Every override calls straight
  through to vLLM (at DP > 1 the DP agreement on the drafter still applies).
* ``SYNC``: sync scheduling, PP batches in flight (docs/design.md). The
  scheduler output carries every token a rank needs: no per-round exchange.
  The last rank attaches each batch's drafts to its output
  (:mod:`vllm_ppspec.sched.draft_delivery`); non-last ranks rebuild the token
  list of a request that re-joins the batch; hybrid models rebuild accepted
  counts by request (:mod:`vllm_ppspec.runner.sync_steps`, in ``LANES`` too).
* ``LANES``: async scheduling with lanes (the default under async): PP + 1
  batches in flight, requests pinned to lanes. vLLM's runner runs its sync
  path on steps made sync-shaped from the rounds each rank holds; the last
  rank posts each round without waiting (:mod:`vllm_ppspec.runner.lane_steps`).
* ``TWO_BATCH``: async scheduling with lanes off (``VLLM_PPSPEC_ASYNC_LANES=0``):
  two batches in flight, the stages taking turns; each round goes from the last
  rank to the others in ``sample_tokens`` (:mod:`vllm_ppspec.runner.two_batch`).

vLLM's counterpart of lanes is Model Runner V2's ``pp_utils.PPHandler``
(vllm/v1/worker/gpu/pp_utils.py), which this plugin does not use: it extends
the V1 runner users run.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class Mode(enum.Enum):
    OFF = "off"
    SYNC = "sync"
    LANES = "async with lanes"
    TWO_BATCH = "async"

    @property
    def exchanges_rounds(self) -> bool:
        """Whether the last rank sends each round to the other ranks."""
        return self in (Mode.LANES, Mode.TWO_BATCH)


def choose_mode(
    has_spec: bool, pp_size: int, async_scheduling: bool, lane_scheduler: Callable[[], bool]
) -> Mode:
    """The mode of a runner: speculative decoding under PP, and how it is scheduled
    (``lane_scheduler``: whether the engine runs the plugin's lane scheduler)."""
    if not has_spec or pp_size <= 1:
        return Mode.OFF
    if not async_scheduling:
        return Mode.SYNC
    return Mode.LANES if lane_scheduler() else Mode.TWO_BATCH
