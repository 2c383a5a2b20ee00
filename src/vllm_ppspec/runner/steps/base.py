"""The hooks of one step, the record a step hands from hook to hook, and the chain of parts.

The runner mixin (``runner/mixin.py``) holds one :class:`Steps` object, built once
at set-up for this rank and mode (:func:`vllm_ppspec.runner.steps.build.build_steps`),
and calls its hooks at the same points of every step, with no condition:

===================  ========================================================
``before_execute``   start of ``execute_model``, before vLLM's
``before_update``    in ``_update_states``, before vLLM's
``after_update``     in ``_update_states``, after vLLM's
``after_forward``    end of ``execute_model``, after vLLM's (its output)
``before_sample``    start of ``sample_tokens``, before vLLM's
``sampled_tensor``   where vLLM hands its sampled tensor to
                     ``_update_states_after_model_execute``
``after_sample``     end of ``sample_tokens``, after vLLM's (its output)
``shutdown``         the worker shuts down
===================  ========================================================

``execute_model`` makes one :class:`StepState` (the step's index, its
scheduler output, and what a part records for a later hook of the same step)
and ``sample_tokens`` gets the same record. ``OFF`` is :class:`Steps` itself:
no part, vLLM's own PP broadcast and drafter. A mode's :class:`ActiveSteps`
calls each hook of its parts in order; each part (:class:`Part`) implements
the hooks it needs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from vllm_ppspec.choice.policy import Mode
from vllm_ppspec.runner.drafter.scope import drafter_hidden
from vllm_ppspec.runner.view import RunnerView


@dataclass
class StepState:
    """One step, from ``execute_model`` to its ``sample_tokens``."""

    index: int  # execute_model calls on this rank before this one (the same on every rank)
    scheduler_output: Any
    rows: Any = None  # lanes: this step's rows, recorded after its forward
    received: Any = None  # the intermediate tensors vLLM received for this step (not first rank)


class Part:
    """One piece of a mode's steps: every hook does nothing unless overridden."""

    def before_execute(self, view: RunnerView, state: StepState) -> None:
        pass

    def before_update(self, view: RunnerView, scheduler_output: Any) -> None:
        pass

    def after_update(self, view: RunnerView, scheduler_output: Any) -> None:
        pass

    def after_forward(self, view: RunnerView, state: StepState, output: Any, received: Any) -> None:
        pass

    def before_sample(self, view: RunnerView, state: StepState) -> None:
        pass

    def sampled_tensor(self, output_token_ids: Any) -> None:
        pass

    def after_sample(self, view: RunnerView, state: StepState, output: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass


class Steps(Part):
    """``OFF``: no part; vLLM's own PP broadcast of sampled tokens; the drafter shown."""

    mode = Mode.OFF

    def pp_broadcast(self, vllm_broadcast: Any, sampled_token_ids: Any) -> None:
        vllm_broadcast(sampled_token_ids)

    def drafter_scope(self, runner: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def sample(self, vllm_sample: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        """vLLM's ``_sample`` (external launcher's other ranks: the last rank's tokens)."""
        return vllm_sample(logits, spec_decode_metadata)

    def sampling(self, runner: Any) -> contextlib.AbstractContextManager[None]:
        """Around vLLM's ``sample_tokens`` (external launcher's other ranks: no drafter)."""
        return contextlib.nullcontext()


class ActiveSteps(Steps):
    """A mode's steps on one rank: its parts' hooks, in order."""

    def __init__(self, mode: Mode, parts: list[Part], hides_drafter: bool) -> None:
        self.mode = mode
        self.parts = tuple(parts)
        self.hides_drafter = hides_drafter  # non-last ranks hold no drafter

    def pp_broadcast(self, vllm_broadcast: Any, sampled_token_ids: Any) -> None:
        pass  # the rounds (lanes) or the scheduler output (sync) carry them

    def drafter_scope(self, runner: Any) -> contextlib.AbstractContextManager[None]:
        return drafter_hidden(runner, self.hides_drafter)

    def before_execute(self, view: RunnerView, state: StepState) -> None:
        for part in self.parts:
            part.before_execute(view, state)

    def before_update(self, view: RunnerView, scheduler_output: Any) -> None:
        for part in self.parts:
            part.before_update(view, scheduler_output)

    def after_update(self, view: RunnerView, scheduler_output: Any) -> None:
        for part in self.parts:
            part.after_update(view, scheduler_output)

    def after_forward(self, view: RunnerView, state: StepState, output: Any, received: Any) -> None:
        for part in self.parts:
            part.after_forward(view, state, output, received)

    def before_sample(self, view: RunnerView, state: StepState) -> None:
        for part in self.parts:
            part.before_sample(view, state)

    def sampled_tensor(self, output_token_ids: Any) -> None:
        for part in self.parts:
            part.sampled_tensor(output_token_ids)

    def after_sample(self, view: RunnerView, state: StepState, output: Any) -> None:
        for part in self.parts:
            part.after_sample(view, state, output)

    def shutdown(self) -> None:
        for part in self.parts:
            part.shutdown()
