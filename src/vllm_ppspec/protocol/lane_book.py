"""Make each lanes step, worker side, as sync scheduling would send it (async scheduling).

Under async scheduling the plugin's scheduler (:mod:`vllm_ppspec.sched.lanes`)
pins each request to a lane and schedules its next batch while the output of
its previous one (PP steps earlier) is still unprocessed. For that request the
scheduler output is optimistic: ``num_computed_tokens`` and ``num_output_tokens``
assume all of the previous round's drafts were accepted (vLLM's async
placeholders), ``all_token_ids`` lacks the previous round's tokens, and the
drafts are ``-1`` placeholders.

Every rank holds that previous round by request (:class:`LaneBook`): the last
rank records what it sampled and drafted; the other ranks receive the same
matrices over the round transport. :func:`make_sync_shaped` rewrites the
step's cached-request data with it, on every rank, before vLLM's runner sees
it, into exactly what sync scheduling would have sent: true counts, the full
token list, the real drafts, and the sampled tokens for non-last ranks
(``new_token_ids``, as ``Scheduler._make_cached_request_data`` builds them
under sync PP). The runner then runs its sync path (every request re-joins the
persistent batch each step, since the previous step held the other lanes).

Which requests need a round is read from the scheduler's own figures, not from
step arithmetic: a request's placeholders are ``num_output_tokens`` minus the
output tokens in ``all_token_ids``; none means the scheduler already processed
the previous round; ``1 + drafts`` of the recorded round means it did not.
Anything else raises :class:`LaneError` (same scheduler output, same rounds:
every rank raises at the same step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ppspec.protocol.accounting import PAD_ID


class LaneError(RuntimeError):
    """A scheduled request's figures do not match the round every rank recorded."""


@dataclass(frozen=True)
class RequestRound:
    """One request's share of a speculative round."""

    step: int  # the step (execute_model call) that computed it
    tokens: list[int]  # accepted drafts, then the bonus or recovered token
    drafts: list[int]  # the drafts proposed after it
    num_drafts: int  # drafts the step verified


class LaneBook:
    """Each request's latest round, and the step that last scheduled it."""

    def __init__(self) -> None:
        self.rounds: dict[str, RequestRound] = {}
        self.last_step: dict[str, int] = {}

    def record(
        self,
        step: int,
        req_ids: list[str],
        sampled: torch.Tensor,
        drafts: torch.Tensor,
        discard: Any,
        num_drafts: dict[str, int],
    ) -> None:
        """Record one round: row ``i`` of ``sampled`` / ``drafts`` is ``req_ids[i]``'s.

        Discarded rows (partial prefills) produced no token and are skipped,
        and so are requests forgotten since the step ran: a finished request's
        last, wasted step can reach a non-last rank after its finish did, and
        its round would otherwise stay in the book for good.
        """
        sampled_rows = sampled.tolist()
        draft_rows = drafts.tolist()
        for i, req_id in enumerate(req_ids):
            if discard[i] or req_id not in self.last_step:
                continue
            tokens = [t for t in sampled_rows[i] if t != PAD_ID]
            self.rounds[req_id] = RequestRound(
                step, tokens, draft_rows[i], num_drafts.get(req_id, 0)
            )

    def scheduled(self, step: int, req_ids: Any) -> None:
        for req_id in req_ids:
            self.last_step[req_id] = step

    def forget(self, req_ids: Any) -> None:
        for req_id in req_ids:
            self.rounds.pop(req_id, None)
            self.last_step.pop(req_id, None)

    def missing(self, scheduler_output: Any, num_prompt_tokens: Callable[[str], int]) -> bool:
        """Whether a request of this step waits for a round this book does not hold yet."""
        data = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(data.req_ids):
            if _placeholders(data, i, req_id, num_prompt_tokens) == 0:
                continue
            rnd = self.rounds.get(req_id)
            if rnd is None or rnd.step != self.last_step.get(req_id):
                return True
        return False


def _placeholders(data: Any, i: int, req_id: str, num_prompt_tokens: Callable[[str], int]) -> int:
    all_ids = data.all_token_ids.get(req_id)
    if all_ids is None:
        raise LaneError(
            f"vllm-ppspec: request {req_id} came without all_token_ids; under lanes every "
            "request skips the step before its own, so the scheduler must send them"
        )
    if req_id in data.resumed_req_ids:
        return 0
    return int(data.num_output_tokens[i]) - (len(all_ids) - num_prompt_tokens(req_id))


def make_sync_shaped(
    scheduler_output: Any, book: LaneBook, num_prompt_tokens: Callable[[str], int]
) -> None:
    """Rewrite this step's cached requests as sync scheduling would send them (module docs)."""
    data = scheduler_output.scheduled_cached_reqs
    spec = scheduler_output.scheduled_spec_decode_tokens
    new_token_ids: list[list[int]] = []
    for i, req_id in enumerate(data.req_ids):
        pending = _placeholders(data, i, req_id, num_prompt_tokens)
        all_ids = data.all_token_ids[req_id]
        rnd = book.rounds.get(req_id)
        if rnd is not None and rnd.step != book.last_step.get(req_id):
            rnd = None  # from before a preemption, or not this request's latest step
        if pending:
            if rnd is None:
                raise LaneError(
                    f"vllm-ppspec: request {req_id} has {pending} placeholder tokens but no "
                    "round of its previous step was recorded"
                )
            if pending != 1 + rnd.num_drafts or not rnd.tokens:
                raise LaneError(
                    f"vllm-ppspec: request {req_id} has {pending} placeholder tokens; its "
                    f"previous round verified {rnd.num_drafts} drafts and produced "
                    f"{len(rnd.tokens)} tokens (the scheduler must lag by one round)"
                )
            rejected = rnd.num_drafts - (len(rnd.tokens) - 1)
            all_ids = all_ids + rnd.tokens
            data.all_token_ids[req_id] = all_ids
            data.num_output_tokens[i] = len(all_ids) - num_prompt_tokens(req_id)
            data.num_computed_tokens[i] -= rejected
        if req_id in spec and rnd is not None:
            # The drafts proposed after the request's latest round, for the
            # scheduler's -1 placeholders. Without a round (a new or resumed
            # request) the -1 stay: vLLM's padding of a one-token step to
            # uniform spec decoding, rejected by the sampler as under sync.
            spec[req_id] = rnd.drafts[: len(spec[req_id])]
        # Scheduler._make_cached_request_data (vllm/v1/core/sched/scheduler.py),
        # its sync-PP branch: the tokens to compute that are not drafts.
        computed = data.num_computed_tokens[i]
        num_tokens = scheduler_output.num_scheduled_tokens[req_id] - len(spec.get(req_id, ()))
        new_token_ids.append(all_ids[computed : computed + num_tokens])
    data.new_token_ids = new_token_ids
