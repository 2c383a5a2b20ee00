"""The steps of a draft model on the first stage (runner/drafter/first_stage.py).

:class:`FirstStageDrafter` on the first rank drafts after vLLM's
``_update_states`` and sends the drafts with the step's intermediate tensors;
:class:`ReceiveDrafts` on each later rank takes them out before vLLM reads the
tensors, writes them into its input batch, and a middle rank passes them on.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_ppspec.protocol.draft_tensor import KEY, decode, encode, with_slots
from vllm_ppspec.runner.clocks import Clocks
from vllm_ppspec.runner.drafter.first_stage import DraftCatchUp, write_drafts
from vllm_ppspec.runner.steps.base import Part, StepState
from vllm_ppspec.runner.view import RunnerView


class FirstStageDrafter(Part):
    """First rank: draft after ``_update_states``; send the drafts with the step's tensors."""

    def __init__(self, catch_up: DraftCatchUp, k: int, clocks: Clocks, tp: int = 1) -> None:
        self.catch_up = catch_up
        self.k = max(k, 1)
        self.clocks = clocks
        self.tp = tp  # the TP size: the drafts' length never divides by it (draft_tensor.encode)
        self.drafts: dict[str, list[int]] = {}

    def before_update(self, view: RunnerView, scheduler_output: Any) -> None:
        self.catch_up.forget(scheduler_output.finished_req_ids)

    def after_update(self, view: RunnerView, scheduler_output: Any) -> None:
        if scheduler_output.total_num_scheduled_tokens == 0:
            self.drafts = {}
            return
        with self.clocks.timing("draft_s"):
            self.drafts = self.catch_up.step(scheduler_output)
        write_drafts(view, self.drafts, scheduler_output.scheduled_spec_decode_tokens)

    def after_forward(self, view: RunnerView, state: StepState, output: Any, received: Any) -> None:
        if hasattr(output, "tensors"):
            output.tensors[KEY] = encode(self.drafts, self.k, self.tp)


class ReceiveDrafts(Part):
    """Later ranks: take the drafts out of the received tensors, write them into the
    input batch; a middle rank passes them on with its own tensors."""

    def __init__(self, passes_on: bool) -> None:
        self.passes_on = passes_on
        self.received: torch.Tensor | None = None

    def before_execute(self, view: RunnerView, state: StepState) -> None:
        tensors = getattr(state.received, "tensors", None)  # waits for the receive
        self.received = None if tensors is None else tensors.pop(KEY, None)
        if tensors is not None and self.received is None:
            raise RuntimeError("vllm-ppspec: the first stage's drafts did not arrive")

    def after_update(self, view: RunnerView, scheduler_output: Any) -> None:
        if self.received is None:
            return
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        write_drafts(view, decode(self.received, with_slots(scheduled)), scheduled)

    def after_forward(self, view: RunnerView, state: StepState, output: Any, received: Any) -> None:
        if self.passes_on and self.received is not None and hasattr(output, "tensors"):
            output.tensors[KEY] = self.received
