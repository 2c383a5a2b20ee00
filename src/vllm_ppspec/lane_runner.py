"""The runner's side of async scheduling with lanes (a mixin of the plugin runner).

Collectives, on every rank of the PP group, one per step that sampled (step
``s``), in step order: the round ``all_reduce`` (:mod:`vllm_ppspec.transport`).
The last rank posts it at the end of ``sample_tokens(s)`` without waiting and
completes it at the start of ``execute_model(s + PP)``; PP rank ``r`` < last
receives it at the start of ``execute_model(s + PP - r)``, when the round is due
(the last stage finished step ``s`` as stage ``r`` starts step ``s + PP - r``),
or earlier if a request of its step needs it. No rank waits for a round its
step does not need.

Every rank then makes each step sync-shaped (:func:`lanes.make_sync_shaped`)
before vLLM's ``execute_model`` runs, and vLLM's runner runs its sync path.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.parallel_state import get_pp_group

from vllm_ppspec import faults
from vllm_ppspec.lanes import LaneBook, make_sync_shaped
from vllm_ppspec.transport import PostedRound, RoundChannel

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


class MissingStashError(RuntimeError):
    """A non-last PP rank reached sample_tokens without what its execute_model left."""


@dataclass
class _LaneRows:
    """One step's rows: what a round's matrices mean, recorded when the step ran."""

    step: int
    req_ids: list[str]
    discard: Any  # numpy bool [rows]: partial prefills, whose sample is dropped
    num_drafts: dict[str, int]


def lane_scheduler_selected(runner: Any) -> bool:
    """Whether the engine runs the plugin's lane scheduler (async lanes)."""
    from vllm_ppspec.lane_scheduler import PPSpecLaneScheduler

    cls = runner.vllm_config.scheduler_config.get_scheduler_cls()
    return isinstance(cls, type) and issubclass(cls, PPSpecLaneScheduler)


class LaneStepsMixin:
    """Async lanes on one runner; mixed in before vLLM's GPUModelRunner."""

    # Provided by GPUModelRunner or the plugin's runner mixin.
    requests: dict[str, Any]
    input_batch: Any
    _ppspec_is_last: bool
    _ppspec_channel: RoundChannel
    _ppspec_faults: faults.Faults
    _ppspec_step: int
    _ppspec_round_sampled: torch.Tensor | None
    ppspec_step_s: float

    def _ppspec_lane_setup(self) -> None:
        self._ppspec_book = LaneBook()
        self._ppspec_lane_step = 0  # execute_model calls, the same on every rank
        self._ppspec_lane_so: SchedulerOutput | None = None
        self._ppspec_lane_rows: _LaneRows | None = None  # this step's rows
        self._ppspec_unreceived: deque[_LaneRows] = deque()  # non-last ranks
        self._ppspec_posted: deque[tuple[int, PostedRound]] = deque()  # last rank

    def _ppspec_lane_prepare(self, scheduler_output: SchedulerOutput) -> None:
        """Every rank, before vLLM's execute_model: the step made sync-shaped."""
        step = self._ppspec_lane_step
        self._ppspec_lane_step += 1
        book = self._ppspec_book
        book.forget(scheduler_output.finished_req_ids)
        pp = get_pp_group()
        start = time.perf_counter()
        if self._ppspec_is_last:
            posted = self._ppspec_posted
            while posted and posted[0][0] <= step - pp.world_size:
                posted.popleft()[1].wait()
        else:
            due = step - (pp.world_size - pp.rank_in_group)
            unreceived = self._ppspec_unreceived
            while unreceived and unreceived[0].step <= due:
                self._ppspec_receive(unreceived.popleft())
            while unreceived and book.missing(scheduler_output, self._ppspec_prompt_len):
                self._ppspec_receive(unreceived.popleft())
        self.ppspec_step_s -= time.perf_counter() - start
        make_sync_shaped(scheduler_output, book, self._ppspec_prompt_len)
        book.scheduled(step, scheduler_output.num_scheduled_tokens)
        self._ppspec_lane_rows = None
        self._ppspec_lane_so = scheduler_output

    def _ppspec_prompt_len(self, req_id: str) -> int:
        return int(self.requests[req_id].num_prompt_tokens)

    def _ppspec_rows(self, scheduler_output: SchedulerOutput) -> _LaneRows:
        """This step's rows, as the round's matrices will order them."""
        num_reqs = self.input_batch.num_reqs
        return _LaneRows(
            step=self._ppspec_lane_step - 1,
            req_ids=list(self.input_batch.req_ids[:num_reqs]),
            discard=self.discard_request_mask.np[:num_reqs].copy(),  # type: ignore[attr-defined]
            num_drafts={
                r: len(t) for r, t in scheduler_output.scheduled_spec_decode_tokens.items()
            },
        )

    def _ppspec_receive(self, rows: _LaneRows) -> None:
        rnd = self._ppspec_channel.recv(len(rows.req_ids))
        if self._ppspec_faults.reached("raise_in_round", rows.step + 1):
            raise faults.InjectedFault(f"raise_in_round@{rows.step + 1} on a non-last rank")
        self._ppspec_book.record(
            rows.step, rows.req_ids, rnd.sampled, rnd.drafts, rows.discard, rows.num_drafts
        )

    def _ppspec_sample_capturing(self, grammar_output: Any) -> tuple[Any, torch.Tensor]:
        """Last rank: vLLM's sample_tokens, and the sampled tensor it produced.

        The tensor is captured where vLLM hands it to
        ``_update_states_after_model_execute``. If no sampler ran, the other
        ranks still wait for a round: they get 0 rows, which never matches a
        batch with requests, so every rank raises.
        """
        self._ppspec_round_sampled = None
        output = super().sample_tokens(grammar_output)  # type: ignore[misc]
        sampled = self._ppspec_round_sampled
        self._ppspec_round_sampled = None
        if sampled is None:
            sampled = torch.empty((0, 1), dtype=torch.int32)
        return output, sampled

    def _ppspec_lane_sample(self, grammar_output: Any) -> Any:
        if not self._ppspec_is_last:
            output = super().sample_tokens(grammar_output)  # type: ignore[misc]
            rows, self._ppspec_lane_rows = self._ppspec_lane_rows, None
            if self._ppspec_faults.reached("drop_stash", self._ppspec_step):
                rows = None
            if rows is None:
                raise MissingStashError(
                    f"PP rank {get_pp_group().rank_in_group}: sample_tokens was called "
                    "without a step executed before it; the rounds would be misattributed."
                )
            self._ppspec_unreceived.append(rows)
            return output
        output, sampled = self._ppspec_sample_capturing(grammar_output)
        rows = self._ppspec_rows(self._ppspec_lane_so)
        posted = self._ppspec_channel.post(
            self.input_batch.num_reqs,
            sampled,
            self._draft_token_ids,  # type: ignore[attr-defined]
        )
        if posted.local is not None:
            self._ppspec_book.record(
                rows.step,
                rows.req_ids,
                posted.local.sampled,
                posted.local.drafts,
                rows.discard,
                rows.num_drafts,
            )
        self._ppspec_posted.append((rows.step, posted))
        return output
