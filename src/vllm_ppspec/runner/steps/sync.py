"""Rebuild on each rank the state the scheduler output does not carry (sync and lanes mode).

Sync mode keeps PP batches in flight; lanes mode makes its steps sync-shaped,
so both rebuild that state from what the scheduler output does carry.

* :meth:`SyncSteps.restore_output_tokens` (non-last ranks): a re-joining
  request's full token list.
* :meth:`SyncSteps.restore_accepted_counts` (hybrid models, every rank): each
  row's accepted count of its request's last round
  (:mod:`vllm_ppspec.protocol.accepted_counts`).
* :meth:`SyncSteps.sample` (sync mode, last rank): each batch's drafts
  attached to its output (:func:`vllm_ppspec.sched.draft_delivery.attach_drafts`).

No collective: in sync mode the stages never wait for each other.
Hooks (``base.py``): ``before_update``, ``after_update``, ``sample``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_ppspec.policy import Mode
from vllm_ppspec.protocol.accepted_counts import AcceptedCounts
from vllm_ppspec.runner.steps.base import Steps
from vllm_ppspec.runner.view import RunnerView
from vllm_ppspec.sched.draft_delivery import attach_drafts


class SyncSteps(Steps):
    mode = Mode.SYNC

    def __init__(self, is_last: bool, hybrid: bool, skip_accepted_counts: bool = False) -> None:
        self.is_last = is_last
        self.counts = AcceptedCounts() if hybrid else None
        # Test fault injection (protocol/faults.py): non-last ranks skip the restore.
        self.skip_accepted_counts = skip_accepted_counts

    def before_update(self, view: RunnerView, scheduler_output: Any) -> None:
        if not self.is_last:
            self.restore_output_tokens(view.requests, scheduler_output)

    def after_update(self, view: RunnerView, scheduler_output: Any) -> None:
        if self.counts is not None:
            self.restore_accepted_counts(view, scheduler_output)

    def sample(self, view: RunnerView, fault_step: int, vllm_sample: Callable[[], Any]) -> Any:
        output = vllm_sample()
        if self.is_last:
            attach_drafts(output, view.take_drafts())
        return output

    @staticmethod
    def restore_output_tokens(requests: dict[str, Any], scheduler_output: Any) -> None:
        """Non-last ranks: a re-joining request's full token list.

        With speculative decoding the scheduler sends a non-last rank only the
        last sampled token of each round, not the accepted drafts before it;
        vLLM's ``_update_states`` then leaves the cached request shorter than
        its computed tokens. That is harmless while the request stays in the
        persistent batch (its earlier positions are computed), but a request
        that left the batch is re-added from that short list and its next
        input ids are read past its end. The scheduler sends ``all_token_ids``
        for exactly those requests (not scheduled in the previous step); take
        the tokens up to the computed ones from it, as vLLM itself does for
        resumed requests under async scheduling. Mirrors the resumed-request
        branch of ``GPUModelRunner._update_states``
        (vllm/v1/worker/gpu_model_runner.py; hash pinned in
        version_data.MIRRORED_FUNCTIONS).
        """
        cached = scheduler_output.scheduled_cached_reqs
        all_token_ids = cached.all_token_ids
        if not all_token_ids:
            return
        for i, req_id in enumerate(cached.req_ids):
            tokens = all_token_ids.get(req_id)
            req_state = requests.get(req_id)
            if tokens is None or req_state is None:
                continue
            num_computed = cached.num_computed_tokens[i]
            if num_computed >= req_state.num_prompt_tokens:
                req_state.output_token_ids[:] = tokens[req_state.num_prompt_tokens : num_computed]

    def restore_accepted_counts(self, view: RunnerView, scheduler_output: Any) -> None:
        """Hybrid models: each row's count of its request's last round.

        Runs on every rank after ``_update_states`` (the batch now holds this
        step's rows; re-added requests were reset to 1) and before
        ``_prepare_inputs`` reads the counts.
        """
        counts = self.counts
        assert counts is not None
        for req_id in scheduler_output.finished_req_ids:
            counts.forget(req_id)
        event = view.accepted_counts_event
        if event is not None:
            event.synchronize()  # the sampler's own D2H copy must not land later
        batch = view.input_batch
        skip_restore = not self.is_last and self.skip_accepted_counts
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id in cached.resumed_req_ids:
                counts.forget(req_id)  # recomputed from its prompt: count 1
                continue
            valid = counts.valid_tokens(req_id, cached.num_computed_tokens[i])
            row = batch.req_id_to_index.get(req_id)
            if valid is not None and row is not None and not skip_restore:
                batch.num_accepted_tokens_cpu[row] = valid
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        for req_id, num in scheduler_output.num_scheduled_tokens.items():
            state = view.requests.get(req_id)
            if state is not None:
                counts.record(
                    req_id, state.num_computed_tokens, num, len(spec_tokens.get(req_id, ()))
                )
