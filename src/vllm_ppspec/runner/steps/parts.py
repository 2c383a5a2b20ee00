"""Build the mode's steps object once at runner set-up, in one place.

:func:`build_steps` turns the mode (``vllm_ppspec.policy``) into its steps
object (``base.py``) with the shared parts it needs: the round channel, the
clocks, the fault switches. Collective, every PP rank, once, in this order:
the round shape's ``all_reduce`` (``RoundChannel.agree_shape``), ``LANES``
only.

:func:`check_engine_mode` refuses a runner whose engine does not run the
plugin's scheduler for that mode (the two halves decided the mode apart).
"""

from __future__ import annotations

from typing import Any

from vllm_ppspec.policy import Mode, scheduler_of, scheduler_serves
from vllm_ppspec.protocol import faults
from vllm_ppspec.protocol.rounds import RoundChannel
from vllm_ppspec.runner.clocks import Clocks
from vllm_ppspec.runner.steps.base import Steps
from vllm_ppspec.runner.steps.lanes import LaneSteps
from vllm_ppspec.runner.steps.sync import SyncSteps
from vllm_ppspec.runner.view import RunnerView


def check_engine_mode(vllm_config: Any, mode: Mode) -> None:
    """The engine's scheduler is the plugin's for ``mode`` (or a subclass)."""
    expected = scheduler_of(mode)
    if expected is None:
        return
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    if not scheduler_serves(cls, mode):
        raise RuntimeError(
            f"vllm-ppspec: this runner runs PP + speculative decoding in {mode.value} mode, "
            f"which needs the engine's scheduler {expected}; the engine runs {cls!r}. "
            "Load the plugin ('ppspec' in VLLM_PLUGINS, or leave it unset) in every process."
        )


def build_steps(
    mode: Mode,
    pp: Any,
    *,
    hybrid: bool,
    capacity: int,
    k: int,
    fault: faults.Faults,
    clocks: Clocks,
    view: RunnerView,
) -> Steps:
    """The steps object of ``mode`` for PP rank ``pp.rank_in_group``."""
    if mode is Mode.OFF:
        return Steps()
    rebuilds = SyncSteps(pp.is_last_rank, hybrid, fault.skip_accepted_counts)
    if mode is Mode.SYNC:
        return rebuilds
    # One message per round, last rank to the others, of a static size; every
    # PP rank agrees on the shape here: after it, posting never blocks.
    channel = RoundChannel(pp.cpu_group, pp.last_rank, capacity, k)
    channel.agree_shape()
    # Each step reaches vLLM's runner as sync scheduling would send it, so its
    # sync path runs; rounds still travel from the last rank, one per step,
    # completed PP steps later.
    view.run_sync_path()
    return LaneSteps(
        channel, pp.world_size, pp.rank_in_group, pp.is_last_rank, fault, clocks, rebuilds
    )
