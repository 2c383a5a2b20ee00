"""Send the rounds of lanes mode from the last rank; receive and use them on the others.

Lanes mode (async scheduling with lanes): one round per step that sampled,
in step order (:mod:`vllm_ppspec.protocol.rounds`). :class:`LaneSender` (last
rank) posts its round to every other rank at the end of its
``sample_tokens(s)`` without waiting; :class:`LaneReceiver` (each other rank)
posts its receive there. Both keep one queue entry per step, pre-seeded with
empty entries as many steps as a round takes to come due, so that taking the
oldest entry at the start of each ``execute_model`` finds the round that is
due: the sender completes the sends of step ``s - PP``; PP rank ``r``
receives the round of step ``s - (PP - r)`` (the last stage finished it as
stage ``r`` starts step ``s``), and earlier ones if a request of its step
needs them. A step that samples nothing queues an empty entry.

Every rank then makes each step sync-shaped
(:func:`vllm_ppspec.protocol.lane_book.make_sync_shaped`) before vLLM's
``execute_model`` runs, and vLLM's runner runs its sync path.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from vllm.sequence import IntermediateTensors

from vllm_ppspec.protocol import faults
from vllm_ppspec.protocol.lane_book import LaneBook, make_sync_shaped
from vllm_ppspec.protocol.rounds import PostedRound, RoundChannel
from vllm_ppspec.runner.clocks import Clocks
from vllm_ppspec.runner.health.rank_errors import MissingRowsError
from vllm_ppspec.runner.steps.base import Part, StepState
from vllm_ppspec.runner.steps.capture import SampledCapture
from vllm_ppspec.runner.view import RunnerView


@dataclass
class LaneRows:
    """One step's rows: what a round's matrices mean, recorded when the step ran."""

    step: int
    req_ids: list[str]
    discard: Any  # numpy bool [rows]: partial prefills, whose sample is dropped
    num_drafts: dict[str, int]
    pending: PostedRound | None = None  # receivers: this rank's receive, posted


def rows_of(view: RunnerView, state: StepState) -> LaneRows:
    """This step's rows, as the round's matrices order them."""
    num_reqs = view.num_reqs
    spec = state.scheduler_output.scheduled_spec_decode_tokens
    return LaneRows(
        step=state.index,
        req_ids=list(view.input_batch.req_ids[:num_reqs]),
        discard=view.discard_mask[:num_reqs].copy(),
        num_drafts={r: len(t) for r, t in spec.items()},
    )


class _Lanes(Part):
    """The lane book both sides keep, and the step made sync-shaped."""

    def __init__(self, channel: RoundChannel, clocks: Clocks, due_after: int) -> None:
        self.channel = channel
        self.clocks = clocks
        self.book = LaneBook()
        # One entry per step, oldest first; the first ``due_after`` are empty.
        self.queue: deque[Any] = deque([None] * due_after)

    def before_execute(self, view: RunnerView, state: StepState) -> None:
        scheduler_output = state.scheduler_output
        self.book.forget(scheduler_output.finished_req_ids)

        def prompt_len(req_id: str) -> int:
            return int(view.requests[req_id].num_prompt_tokens)

        with self.clocks.timing("wait_s"):
            self.settle(self.queue.popleft(), scheduler_output, prompt_len)
        make_sync_shaped(scheduler_output, self.book, prompt_len)
        self.book.scheduled(state.index, scheduler_output.num_scheduled_tokens)

    def settle(self, entry: Any, scheduler_output: Any, prompt_len: Any) -> None:
        raise NotImplementedError

    def record(self, rows: LaneRows, sampled: Any, drafts: Any) -> None:
        self.book.record(rows.step, rows.req_ids, sampled, drafts, rows.discard, rows.num_drafts)


class LaneSender(_Lanes):
    """Last rank: each step's round posted to the other ranks, sends completed when due."""

    def __init__(self, channel: RoundChannel, clocks: Clocks, pp_size: int) -> None:
        super().__init__(channel, clocks, due_after=pp_size)
        self.capture = SampledCapture()

    def settle(self, entry: Any, scheduler_output: Any, prompt_len: Any) -> None:
        if entry is not None:
            entry.wait()

    def after_forward(self, view: RunnerView, state: StepState, output: Any, received: Any) -> None:
        if output is not None:  # vLLM returned its output: no sample_tokens this step
            self.queue.append(None)

    def before_sample(self, view: RunnerView, state: StepState) -> None:
        self.capture.arm()

    def sampled_tensor(self, output_token_ids: Any) -> None:
        self.capture.seen(output_token_ids)

    def after_sample(self, view: RunnerView, state: StepState, output: Any) -> None:
        rows = rows_of(view, state)
        posted = self.channel.post(view.num_reqs, self.capture.take(), view.drafts)
        if posted.local is not None:
            self.record(rows, posted.local.sampled, posted.local.drafts)
        self.queue.append(posted)


class LaneReceiver(_Lanes):
    """Other ranks: each step's receive posted after its sample, the round used when due."""

    def __init__(
        self, channel: RoundChannel, clocks: Clocks, due_after: int, pp_rank: int, fault_at: int
    ) -> None:
        super().__init__(channel, clocks, due_after)
        self.pp_rank = pp_rank
        self.raise_in_round_at = fault_at  # tests (protocol/faults.py): 0 never

    def settle(self, entry: Any, scheduler_output: Any, prompt_len: Any) -> None:
        if entry is not None:
            self.receive(entry)
        # A request of this step needs a later round: receive the next ones
        # early, leaving their entries empty (one entry per step stays).
        queue, i = self.queue, 0
        while i < len(queue) and self.book.missing(scheduler_output, prompt_len):
            later, queue[i] = queue[i], None
            if later is not None:
                self.receive(later)
            i += 1

    def receive(self, rows: LaneRows) -> None:
        assert rows.pending is not None
        rnd = rows.pending.wait()
        self.clocks.received(rnd)
        if 0 < self.raise_in_round_at <= rows.step + 1:
            raise faults.InjectedFault(f"raise_in_round@{rows.step + 1} on a non-last rank")
        self.record(rows, rnd.sampled, rnd.drafts)

    def after_forward(self, view: RunnerView, state: StepState, output: Any, received: Any) -> None:
        if isinstance(output, IntermediateTensors):
            state.rows = rows_of(view, state)
        else:  # vLLM returned its output: no sample_tokens this step
            self.queue.append(None)

    def after_sample(self, view: RunnerView, state: StepState, output: Any) -> None:
        rows, state.rows = state.rows, None
        if rows is None:
            raise MissingRowsError.on_rank(self.pp_rank, "a step executed before it")
        rows.pending = self.channel.expect(len(rows.req_ids))
        self.queue.append(rows)
