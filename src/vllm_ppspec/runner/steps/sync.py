"""Sync mode's parts: a re-joining request's tokens on other ranks, drafts with each batch's output.

Sync mode keeps PP batches in flight and every rank learns the tokens from the
scheduler output; lanes mode makes its steps sync-shaped, so it uses
:class:`RestoreOutputTokens` too. No collective: the stages never wait for
each other here.
"""

from __future__ import annotations

from typing import Any

from vllm_ppspec.runner.steps.base import Part
from vllm_ppspec.runner.view import RunnerView
from vllm_ppspec.sched.draft_delivery import attach_drafts


class RestoreOutputTokens(Part):
    """Other ranks: a re-joining request's full token list (``before_update``)."""

    def before_update(self, view: RunnerView, scheduler_output: Any) -> None:
        restore_output_tokens(view.requests, scheduler_output)


class DeliverDrafts(Part):
    """Last rank, sync mode: each batch's drafts attached to its output (``after_sample``;
    :func:`vllm_ppspec.sched.draft_delivery.attach_drafts`); ``placeholders``: the
    first stage drafts (vLLM's zero drafts of a rank without a drafter are the slots)."""

    def __init__(self, placeholders: bool = False) -> None:
        self.placeholders = placeholders

    def after_sample(self, view: RunnerView, state: Any, output: Any) -> None:
        drafts = view.take_drafts()
        if self.placeholders and drafts is not None:
            # vLLM's zeros are K wide; the scheduler chose this step's K (dynamic
            # K: num_spec_tokens_to_schedule), which vLLM's own drafter would draft.
            k = getattr(state.scheduler_output, "num_spec_tokens_to_schedule", None)
            if k is not None:
                drafts.draft_token_ids = [list(ids)[:k] for ids in drafts.draft_token_ids]
        attach_drafts(output, drafts, self.placeholders)


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
    compat.data.MIRRORED_FUNCTIONS).
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
        # Up to the computed tokens; none where they stop inside the prompt (a
        # preempted request whose cached prefix is shorter than its prompt): vLLM's
        # _update_states then appends the scheduled tokens past the prompt.
        prompt = req_state.num_prompt_tokens
        req_state.output_token_ids[:] = tokens[prompt : max(prompt, cached.num_computed_tokens[i])]
