"""Post, receive and record the rounds of lanes mode (async scheduling with lanes).

Messages, one round per step that sampled (step ``s``), in step order
(:mod:`vllm_ppspec.protocol.rounds`): every rank posts its side at the end of
its ``sample_tokens(s)`` without waiting: the last rank sends the round to
every other rank, each other rank posts its receive (``expect``). The last
rank completes its sends at the start of ``execute_model(s + PP)``; PP rank
``r`` < last completes its receive at the start of
``execute_model(s + PP - r)``, when the round is due (the last stage finished
step ``s`` as stage ``r`` starts step ``s + PP - r``), or earlier if a
request of its step needs it. No rank waits for a round its step does not
need; a round is sent the moment the last rank has it, and one that has
arrived costs no wait.

Every rank then makes each step sync-shaped
(:func:`vllm_ppspec.protocol.lane_book.make_sync_shaped`) before vLLM's
``execute_model`` runs, and vLLM's runner runs its sync path, with sync
mode's rebuilds (``sync.SyncSteps``).

Hooks (``base.py``): all of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_ppspec.policy import Mode
from vllm_ppspec.protocol import faults
from vllm_ppspec.protocol.lane_book import LaneBook, make_sync_shaped
from vllm_ppspec.protocol.rounds import PostedRound, RoundChannel
from vllm_ppspec.runner.clocks import Clocks
from vllm_ppspec.runner.health.rank_errors import MissingStashError
from vllm_ppspec.runner.steps.base import Steps
from vllm_ppspec.runner.steps.capture import SampledCapture
from vllm_ppspec.runner.steps.sync import SyncSteps
from vllm_ppspec.runner.view import RunnerView


@dataclass
class LaneRows:
    """One step's rows: what a round's matrices mean, recorded when the step ran."""

    step: int
    req_ids: list[str]
    discard: Any  # numpy bool [rows]: partial prefills, whose sample is dropped
    num_drafts: dict[str, int]
    pending: PostedRound | None = None  # non-last ranks: this rank's side, posted


class LaneSteps(Steps):
    mode = Mode.LANES

    def __init__(
        self,
        channel: RoundChannel,
        pp_size: int,
        pp_rank: int,
        is_last: bool,
        fault: faults.Faults,
        clocks: Clocks,
        rebuilds: SyncSteps,
    ) -> None:
        self.channel = channel
        self.rebuilds = rebuilds  # sync mode's: each step is sync-shaped
        self.capture = SampledCapture()
        self.pp_size, self.pp_rank, self.is_last = pp_size, pp_rank, is_last
        self.fault = fault
        self.clocks = clocks
        self.book = LaneBook()
        self.step = 0  # execute_model calls, the same on every rank
        self.scheduler_output: Any = None  # this step's
        self.rows: LaneRows | None = None  # this step's rows (non-last: after its forward)
        self.unreceived: deque[LaneRows] = deque()  # non-last ranks
        self.posted: deque[tuple[int, PostedRound]] = deque()  # last rank

    def before_update(self, view: RunnerView, scheduler_output: Any) -> None:
        self.rebuilds.before_update(view, scheduler_output)

    def after_update(self, view: RunnerView, scheduler_output: Any) -> None:
        self.rebuilds.after_update(view, scheduler_output)

    def executed(self, view: RunnerView, scheduler_output: Any) -> None:
        self.rows = self.rows_of(view, scheduler_output)

    def sampled(self, output_token_ids: Any) -> None:
        self.capture.seen(output_token_ids)

    def prepare(self, view: RunnerView, scheduler_output: Any) -> None:
        """Every rank, before vLLM's execute_model: the step made sync-shaped."""
        step = self.step
        self.step += 1
        book = self.book
        book.forget(scheduler_output.finished_req_ids)

        def prompt_len(req_id: str) -> int:
            return int(view.requests[req_id].num_prompt_tokens)

        with self.clocks.timing("wait_s"):
            if self.is_last:
                while self.posted and self.posted[0][0] <= step - self.pp_size:
                    self.posted.popleft()[1].wait()
            else:
                due = step - (self.pp_size - self.pp_rank)
                unreceived = self.unreceived
                while unreceived and unreceived[0].step <= due:
                    self._receive(unreceived.popleft())
                while unreceived and book.missing(scheduler_output, prompt_len):
                    self._receive(unreceived.popleft())
        make_sync_shaped(scheduler_output, book, prompt_len)
        book.scheduled(step, scheduler_output.num_scheduled_tokens)
        self.rows = None
        self.scheduler_output = scheduler_output

    def rows_of(self, view: RunnerView, scheduler_output: Any) -> LaneRows:
        """This step's rows, as the round's matrices will order them."""
        num_reqs = view.num_reqs
        return LaneRows(
            step=self.step - 1,
            req_ids=list(view.input_batch.req_ids[:num_reqs]),
            discard=view.discard_mask[:num_reqs].copy(),
            num_drafts={
                r: len(t) for r, t in scheduler_output.scheduled_spec_decode_tokens.items()
            },
        )

    def _receive(self, rows: LaneRows) -> None:
        assert rows.pending is not None
        rnd = rows.pending.wait()
        self.clocks.received(rnd)
        if self.fault.reached("raise_in_round", rows.step + 1):
            raise faults.InjectedFault(f"raise_in_round@{rows.step + 1} on a non-last rank")
        self.book.record(
            rows.step, rows.req_ids, rnd.sampled, rnd.drafts, rows.discard, rows.num_drafts
        )

    def sample(self, view: RunnerView, fault_step: int, vllm_sample: Callable[[], Any]) -> Any:
        if not self.is_last:
            output = vllm_sample()
            rows, self.rows = self.rows, None
            if self.fault.reached("drop_stash", fault_step):
                rows = None
            if rows is None:
                raise MissingStashError.on_rank(self.pp_rank, "a step executed before it")
            rows.pending = self.channel.expect(len(rows.req_ids))
            self.unreceived.append(rows)
            return output
        output, sampled = self.capture.around(vllm_sample)
        rows = self.rows_of(view, self.scheduler_output)
        posted = self.channel.post(view.num_reqs, sampled, view.drafts)
        if posted.local is not None:
            self.book.record(
                rows.step,
                rows.req_ids,
                posted.local.sampled,
                posted.local.drafts,
                rows.discard,
                rows.num_drafts,
            )
        self.posted.append((rows.step, posted))
        return output
