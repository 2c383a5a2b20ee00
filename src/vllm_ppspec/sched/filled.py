"""Schedule PP + speculative decoding under sync scheduling (PP batches in flight).

vLLM's ``Scheduler`` with one change: a request's drafts are applied when
the output of the batch that proposed them is processed, and only if that
request is in no other batch in flight. With PP-many batches in flight the
engine would otherwise hand the scheduler a batch's drafts before its sampled
tokens (see :mod:`vllm_ppspec.sched.draft_delivery`) and schedule them without their
bonus token, or give them to a request whose next prefill chunk is still in
the pipeline.

And one scheduling policy: with ``D`` batches in flight (``D`` = PP), each
batch takes at most ``ceil(running / D)`` of the running requests that are not
in flight; the rest are held back for the next batch. vLLM's scheduler would put
every runnable request into the first batch and leave the others empty, so
only a token budget smaller than the load would ever fill the pipeline. Held
requests are first in line next step, so batches rotate. Continuing prefill
chunks (already in flight) and new requests are not held.

Everything else is vLLM's: a decode request whose tokens are all computed is
not scheduled again until its output was processed, so it is in at most one
batch in flight.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.request import RequestStatus

from vllm_ppspec.adaptive_k import chooser as adaptive_k
from vllm_ppspec.choice.policy import Mode
from vllm_ppspec.sched.draft_delivery import attached_drafts, placeholders_attached

logger = init_logger("vllm.ppspec")


class BatchesInFlight:
    """Batches with scheduled tokens whose output was not processed yet.

    Each new maximum is logged (``vllm-ppspec: N batches in flight``), which
    the load tests read to see the pipeline filled. Used by both plugin
    schedulers.
    """

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    def scheduled(self, scheduler_output: Any) -> None:
        if scheduler_output.total_num_scheduled_tokens > 0:
            self.now += 1
            if self.now > self.most:
                self.most = self.now
                logger.info("vllm-ppspec: %d batches in flight", self.now)

    def processed(self, scheduler_output: Any) -> None:
        if scheduler_output.total_num_scheduled_tokens > 0:
            self.now -= 1


class PPSpecScheduler(Scheduler):
    ppspec_mode = Mode.SYNC  # policy.scheduler_serves

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ppspec_batches = BatchesInFlight()
        self.ppspec_depth = int(self.vllm_config.max_concurrent_batches)
        self.ppspec_adaptive_k = adaptive_k.start(self)

    def held_back(self) -> list[Any]:
        """Running requests left for a later batch (see the module docstring)."""
        if self.ppspec_depth <= 1:
            return []
        quota = math.ceil(len(self.running) / self.ppspec_depth)
        ready = [r for r in self.running if r.num_in_flight_tokens == 0]
        return ready[quota:]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.ppspec_adaptive_k is not None:
            self.ppspec_adaptive_k.before_schedule(self)
        held = self.held_back()
        if held:
            scheduler_output = self._schedule_without(held, *args, **kwargs)
        else:
            scheduler_output = super().schedule(*args, **kwargs)
        self.ppspec_batches.scheduled(scheduler_output)
        if self.ppspec_adaptive_k is not None:
            self.ppspec_adaptive_k.scheduled(scheduler_output)
        return scheduler_output

    def _schedule_without(self, held: list[Any], *args: Any, **kwargs: Any) -> Any:
        return schedule_without(self, super().schedule, held, None, *args, **kwargs)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        stale = {
            req_id
            for req_id in scheduler_output.num_scheduled_tokens
            if (req := self.requests.get(req_id)) is not None and req.num_stale_output_tokens > 0
        }
        if self.ppspec_adaptive_k is not None:
            self.ppspec_adaptive_k.after_output(self, scheduler_output, model_runner_output)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self.ppspec_batches.processed(scheduler_output)
        drafts = attached_drafts(model_runner_output)
        if drafts is not None:
            placeholders = placeholders_attached(model_runner_output)
            self._ppspec_apply_drafts(drafts, scheduler_output, stale, placeholders)
        return outputs

    def _ppspec_apply_drafts(
        self,
        drafts: DraftTokenIds,
        scheduler_output: Any,
        stale: set[str],
        placeholders: bool = False,
    ) -> None:
        """``placeholders``: slots the first stage drafts into
        (runner/drafter/first_stage.py); a grammar cannot check them, so a
        request with structured output gets none."""
        req_ids: list[str] = []
        draft_ids: list[list[int]] = []
        for req_id, ids in zip(drafts.req_ids, drafts.draft_token_ids, strict=True):
            request = self.requests.get(req_id)
            if (
                req_id not in scheduler_output.num_scheduled_tokens  # not this batch's
                or req_id in stale  # preempted while in flight
                or request is None
                or request.status != RequestStatus.RUNNING
                or request.num_in_flight_tokens > 0  # another batch holds it
                or (placeholders and request.use_structured_output)
            ):
                continue
            req_ids.append(req_id)
            draft_ids.append(list(ids))
        if req_ids:
            super().update_draft_token_ids(DraftTokenIds(req_ids, draft_ids))

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        """Drafts arrive with their batch's output; the engine's post-step copy is ignored."""
        return


def schedule_without(
    sched: Any,
    schedule: Callable[..., Any],
    held: list[Any],
    admit: int | None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``schedule`` (vLLM's ``Scheduler.schedule``) with ``held`` out of ``sched.running``.

    The request limits shrink by as many, so no extra request is admitted
    for them; ``admit``, if given, further caps how many waiting requests this
    call may admit. Afterwards held requests return to their places
    (preempted requests stay out, newly admitted ones stay at the end).
    """
    original = list(sched.running)
    held_ids = {id(r) for r in held}
    sched.running = [r for r in original if id(r) not in held_ids]
    cut = len(held)
    if admit is not None:
        room = sched.max_num_running_reqs - cut - len(sched.running)
        cut += max(0, room - admit)
    sched.max_num_running_reqs -= cut
    sched.max_num_active_reqs -= cut
    try:
        return schedule(*args, **kwargs)
    finally:
        sched.max_num_running_reqs += cut
        sched.max_num_active_reqs += cut
        after_ids = {id(r) for r in sched.running}
        merged = [r for r in original if id(r) in after_ids or id(r) in held_ids]
        merged_ids = {id(r) for r in merged}
        sched.running = merged + [r for r in sched.running if id(r) not in merged_ids]
