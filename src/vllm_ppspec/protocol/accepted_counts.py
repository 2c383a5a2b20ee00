"""Rebuild accepted-draft counts from the scheduler's own bookkeeping.

Hybrid (GDN/Mamba) models keep one recurrent state per request; after a
speculative step the runner shifts it by the number of valid tokens of that
request's last round (``input_batch.num_accepted_tokens_cpu``: accepted drafts
+ 1). vLLM sets that count on the sampler's rank only
(``GPUModelRunner._update_states_after_model_execute``), in the input-batch row
the request had, and resets it to 1 whenever a request is re-added to the
persistent batch. With several batches in flight a request leaves and re-joins
the batch every step, so every rank needs the count by request, not by row.

Under sync scheduling the scheduler output carries it: when a request was
scheduled with ``c`` computed tokens, ``s`` scheduled tokens of which ``d``
drafts, the scheduler rolls back the rejected drafts, so the next time it is
scheduled it has ``c' = c + s - d + accepted`` computed tokens. Hence
``valid = c' - c - s + d + 1`` on every rank, with no message between ranks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class _Scheduled:
    num_computed: int
    num_scheduled: int
    num_drafts: int


class AcceptedCounts:
    """Per-request record of the last scheduling; derives the valid-token count."""

    def __init__(self) -> None:
        self._last: dict[str, _Scheduled] = {}

    def valid_tokens(self, req_id: str, num_computed_now: int) -> int | None:
        """Valid tokens (accepted drafts + 1) of the request's previous round.

        None if the request has no previous round on record (new or resumed).
        Raises ValueError if the scheduler's figures cannot come from one round.
        """
        last = self._last.get(req_id)
        if last is None:
            return None
        accepted = num_computed_now - last.num_computed - last.num_scheduled + last.num_drafts
        if not 0 <= accepted <= last.num_drafts:
            raise ValueError(
                f"request {req_id}: {num_computed_now} computed tokens after a round that "
                f"started at {last.num_computed} with {last.num_scheduled} scheduled tokens "
                f"({last.num_drafts} drafts) implies {accepted} accepted drafts"
            )
        return accepted + 1

    def record(self, req_id: str, num_computed: int, num_scheduled: int, num_drafts: int) -> None:
        self._last[req_id] = _Scheduled(num_computed, num_scheduled, num_drafts)

    def forget(self, req_id: str) -> None:
        self._last.pop(req_id, None)

    def __len__(self) -> int:
        return len(self._last)
