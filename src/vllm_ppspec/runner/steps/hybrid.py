"""Restore hybrid models' accepted counts on every rank, from the scheduler's figures.

A hybrid (GDN/Mamba) model's state update reads each row's accepted count of
its request's last round (``input_batch.num_accepted_tokens_cpu``); only the
last rank sampled it. :class:`RestoreAcceptedCounts` rebuilds it on every rank
from what the scheduler output carries
(:mod:`vllm_ppspec.protocol.accepted_counts`), in sync and lanes mode alike.
Built only for hybrid models.
"""

from __future__ import annotations

from typing import Any

from vllm_ppspec.protocol.accepted_counts import AcceptedCounts
from vllm_ppspec.runner.steps.base import Part
from vllm_ppspec.runner.view import RunnerView


class RestoreAcceptedCounts(Part):
    def __init__(self) -> None:
        self.counts = AcceptedCounts()

    def after_update(self, view: RunnerView, scheduler_output: Any) -> None:
        """After ``_update_states`` (the batch holds this step's rows; re-added
        requests were reset to 1) and before ``_prepare_inputs`` reads the counts."""
        counts = self.counts
        for req_id in scheduler_output.finished_req_ids:
            counts.forget(req_id)
        event = view.accepted_counts_event
        if event is not None:
            event.synchronize()  # the sampler's own D2H copy must not land later
        batch = view.input_batch
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id in cached.resumed_req_ids:
                counts.forget(req_id)  # recomputed from its prompt: count 1
                continue
            valid = counts.valid_tokens(req_id, cached.num_computed_tokens[i])
            row = batch.req_id_to_index.get(req_id)
            if valid is not None and row is not None:
                batch.num_accepted_tokens_cpu[row] = valid
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        for req_id, num in scheduler_output.num_scheduled_tokens.items():
            state = view.requests.get(req_id)
            if state is not None:
                counts.record(
                    req_id, state.num_computed_tokens, num, len(spec_tokens.get(req_id, ()))
                )
