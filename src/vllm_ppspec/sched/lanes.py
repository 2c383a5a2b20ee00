"""Schedule PP + speculative decoding under async scheduling: requests pinned to lanes.

vLLM's ``AsyncScheduler`` with one policy added. Under async scheduling the
engine keeps PP + 1 batches in flight (``policy.batches_in_flight``),
and each running request is pinned to a lane, ``step mod PP``: it is
scheduled only in its lane's steps, so its next batch is scheduled PP steps
after its previous one, while that one's output is still unprocessed (the
async scheduler's placeholders stand in for its tokens). A request is thus in
at most two batches in flight, its previous one and its next, and a stage
runs the next only once it holds the previous one's round
(:mod:`vllm_ppspec.runner.steps.lanes`). Stages never wait for each other: a
stage runs the other lanes' batches while the last stage samples and drafts
a lane's batch, and the engine core's turnaround is hidden behind them.

A request gets the lane of the step that first schedules it (admission, or
resumption after preemption); each step admits at most its share,
``ceil((running + waiting) / PP)`` minus the lane's members, so lanes stay
balanced. Prefill chunks advance one per lane step.

Structured-output requests are scheduled without drafts and only once their
previous output was processed: the engine core builds their grammar bitmask
from the tokens it has, which must include their latest round.

The workers turn each step back into what sync scheduling would have sent
(:mod:`vllm_ppspec.protocol.lane_book`): the tokens and drafts of a request's previous
round reach every rank with that round, not through this scheduler, whose
``num_computed_tokens`` and drafts for the request stay optimistic placeholders
until the output arrives (vLLM's own async bookkeeping).
"""

from __future__ import annotations

import math
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from vllm_ppspec.adaptive_k import chooser as adaptive_k
from vllm_ppspec.choice.policy import Mode
from vllm_ppspec.sched.filled import BatchesInFlight, schedule_without


class PPSpecLaneScheduler(AsyncScheduler):
    ppspec_mode = Mode.LANES  # policy.scheduler_serves

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ppspec_lanes = int(self.vllm_config.parallel_config.pipeline_parallel_size)
        self.ppspec_steps = 0  # schedule() calls: every one reaches the workers
        self.ppspec_lane_of: dict[str, int] = {}
        self.ppspec_batches = BatchesInFlight()
        self.ppspec_adaptive_k = adaptive_k.start(self)

    def lane_split(self, lane: int) -> tuple[list[Any], int]:
        """Running requests of other lanes, and how many waiting ones this step may admit."""
        lane_of = self.ppspec_lane_of
        held = [
            r
            for r in self.running
            if lane_of.get(r.request_id, lane) != lane
            or (r.use_structured_output and r.num_output_placeholders > 0)
        ]
        members = len(self.running) - len(held)
        share = math.ceil((len(self.running) + len(self.waiting)) / self.ppspec_lanes)
        return held, max(0, share - members)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        lane = self.ppspec_steps % self.ppspec_lanes
        self.ppspec_steps += 1
        running = {r.request_id for r in self.running}
        # Preempted and finished requests lose their lane.
        self.ppspec_lane_of = {r: n for r, n in self.ppspec_lane_of.items() if r in running}
        held, admit = self.lane_split(lane)
        if self.ppspec_adaptive_k is not None:
            self.ppspec_adaptive_k.before_schedule(self)
        scheduler_output = schedule_without(self, super().schedule, held, admit, *args, **kwargs)
        for req_id in scheduler_output.num_scheduled_tokens:
            self.ppspec_lane_of.setdefault(req_id, lane)
        self.ppspec_batches.scheduled(scheduler_output)
        if self.ppspec_adaptive_k is not None:
            self.ppspec_adaptive_k.scheduled(scheduler_output)
        return scheduler_output

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        super()._update_after_schedule(scheduler_output)
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests[req_id]
            if request.use_structured_output:
                request.spec_token_ids = []

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        if self.ppspec_adaptive_k is not None:
            self.ppspec_adaptive_k.after_output(self, scheduler_output, model_runner_output)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self.ppspec_batches.processed(scheduler_output)
        return outputs
