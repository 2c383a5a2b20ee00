"""Pass EAGLE-3's auxiliary states on from a middle stage, after each forward.

vLLM's model packs only its own layers' auxiliary states into the
intermediate tensors a stage sends on; a middle stage adds those of the
stages before it (:func:`vllm_ppspec.runner.drafter.eagle3.relay`). Built on
non-last ranks when the drafter is an EAGLE-3 head reading auxiliary states.
"""

from __future__ import annotations

from typing import Any

from vllm.sequence import IntermediateTensors

from vllm_ppspec.runner.drafter import eagle3
from vllm_ppspec.runner.steps.base import Part, StepState
from vllm_ppspec.runner.view import RunnerView


class RelayEagle3(Part):
    def after_forward(self, view: RunnerView, state: StepState, output: Any, received: Any) -> None:
        if received is not None and isinstance(output, IntermediateTensors):
            eagle3.relay(view.model, output, received)
