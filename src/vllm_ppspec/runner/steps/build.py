"""Build this rank's steps for its mode once at runner set-up, and check the engine's scheduler.

:func:`build_steps` turns the mode (``vllm_ppspec.choice.policy``) and this rank's
place in the pipeline into one :class:`~vllm_ppspec.runner.steps.base.Steps`
object: its parts, in the order their hooks run. Optional parts are built
only where they act: hybrid models' accepted counts, EAGLE-3's relay on
middle stages, and the test faults (``protocol/faults.py``). Collective,
every PP rank, once, in this order: the round shape's ``all_reduce``
(``RoundChannel.agree_shape``), ``LANES`` only.

=========  ===============================================  ======================
mode       last rank                                        other ranks
=========  ===============================================  ======================
``OFF``    ``Steps()``: no part                             the same
``SYNC``   ``DeliverDrafts``                                ``RestoreOutputTokens``
``SYNC``,  ``ReceiveDrafts``, ``DeliverDrafts``             first: ``FirstStage-``
drafter    (placeholders)                                   ``Drafter``; middle:
first                                                       ``ReceiveDrafts``; both
                                                            ``RestoreOutputTokens``
``LANES``  ``LaneSender``                                   ``LaneReceiver``,
                                                            ``RestoreOutputTokens``
``EXTER-`` ``SendRound``                                    ``ExternalReceiverSteps``
``NAL``                                                     (no part)
=========  ===============================================  ======================

:func:`check_engine_mode` refuses a runner whose engine does not run the
plugin's scheduler for that mode (the two halves decided the mode apart).
"""

from __future__ import annotations

from typing import Any

from vllm_ppspec.choice.policy import Mode, scheduler_of, scheduler_serves
from vllm_ppspec.protocol import faults
from vllm_ppspec.protocol.rounds import RoundChannel
from vllm_ppspec.runner.clocks import Clocks
from vllm_ppspec.runner.drafter.first_stage import DraftCatchUp
from vllm_ppspec.runner.steps.base import ActiveSteps, Part, Steps, StepState
from vllm_ppspec.runner.steps.drafts import FirstStageDrafter, ReceiveDrafts
from vllm_ppspec.runner.steps.external import ExternalReceiverSteps, RoundBroadcast, SendRound
from vllm_ppspec.runner.steps.hybrid import RestoreAcceptedCounts
from vllm_ppspec.runner.steps.lanes import LaneReceiver, LaneSender
from vllm_ppspec.runner.steps.relay import RelayEagle3
from vllm_ppspec.runner.steps.sync import DeliverDrafts, RestoreOutputTokens
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
    eagle3_relay: bool,
    capacity: int,
    k: int,
    fault: faults.Faults,
    clocks: Clocks,
    view: RunnerView,
    drafter_first: bool = False,
    catch_up: DraftCatchUp | None = None,
    tp: int = 1,
) -> Steps:
    """The steps object of ``mode`` for PP rank ``pp.rank_in_group``.
    ``drafter_first`` (sync mode): the drafter runs on the first stage
    (runner/drafter/first_stage.py), ``catch_up`` its state there; ``tp``:
    the TP size (the drafts' wire length, ``protocol/draft_tensor.encode``)."""
    if mode is Mode.OFF:
        return Steps()
    is_last = pp.is_last_rank
    parts: list[Part] = []
    if mode is Mode.EXTERNAL:
        broadcast = RoundBroadcast(pp.cpu_group, pp.last_rank, capacity, k)
        if is_last:
            return ActiveSteps(mode, [SendRound(broadcast)], hides_drafter=False)
        return ExternalReceiverSteps([], broadcast)
    drafter_first = drafter_first and mode is Mode.SYNC
    if drafter_first:
        if pp.is_first_rank:
            assert catch_up is not None
            parts.append(FirstStageDrafter(catch_up, k, clocks, tp))
        else:
            parts.append(ReceiveDrafts(passes_on=not is_last))
        parts.append(DeliverDrafts(placeholders=True) if is_last else RestoreOutputTokens())
    elif mode is Mode.SYNC:
        parts.append(DeliverDrafts() if is_last else RestoreOutputTokens())
    else:
        # One message per round, last rank to the others, of a static size; every
        # PP rank agrees on the shape here: after it, posting never blocks.
        channel = RoundChannel(pp.cpu_group, pp.last_rank, capacity, k)
        channel.agree_shape()
        # Each step reaches vLLM's runner as sync scheduling would send it, so its
        # sync path runs; rounds still travel from the last rank, one per step.
        view.run_sync_path()
        if is_last:
            parts.append(LaneSender(channel, clocks, pp.world_size))
        else:
            if fault.kind == "drop_rows":
                parts.append(DropRows(fault.at_step))  # before the receiver reads them
            due_after = pp.world_size - pp.rank_in_group
            raise_at = fault.at_step if fault.kind == "raise_in_round" else 0
            parts += [
                LaneReceiver(channel, clocks, due_after, pp.rank_in_group, raise_at),
                RestoreOutputTokens(),
            ]
    if hybrid and (is_last or not fault.skip_accepted_counts):
        parts.append(RestoreAcceptedCounts())
    if eagle3_relay and not is_last:
        parts.append(RelayEagle3())
    if fault.kind == "raise" and not is_last:
        parts.append(RaiseAt(fault.at_step))
    holds_drafter = pp.is_first_rank if drafter_first else is_last
    return ActiveSteps(mode, parts, hides_drafter=not holds_drafter)


class RaiseAt(Part):
    """Test fault ``raise@n``: ``execute_model`` of step n raises before the forward."""

    def __init__(self, step: int) -> None:
        self.step = step

    def before_execute(self, view: RunnerView, state: StepState) -> None:
        if state.index + 1 == self.step:
            raise faults.InjectedFault(f"raise@{self.step} on a non-last PP rank")


class DropRows(Part):
    """Test fault ``drop_rows@n``: from step n on, ``sample_tokens`` loses the
    step's rows (the lane receiver then raises ``MissingRowsError``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def after_sample(self, view: RunnerView, state: StepState, output: Any) -> None:
        if state.index + 1 >= self.step:
            state.rows = None
