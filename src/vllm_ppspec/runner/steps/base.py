"""Define the hooks every mode implements, and ``OFF``'s: each calls vLLM's own.

The runner mixin (``runner/mixin.py``) holds one steps object, built once at set-up
(:func:`vllm_ppspec.runner.steps.parts.build_steps`) for the mode the policy decided
(:mod:`vllm_ppspec.policy`), and calls these hooks at the same points of
every step, whatever the mode:

=================  ==========================================================
``prepare``        start of ``execute_model``, before vLLM's
``before_update``  in ``_update_states``, before vLLM's
``after_update``   in ``_update_states``, after vLLM's
``executed``       non-last ranks, after a forward that returned intermediate tensors
``sample``         ``sample_tokens``: wraps vLLM's (``vllm_sample``)
``sampled``        where vLLM hands its sampled tensor to
                   ``_update_states_after_model_execute`` (last rank)
``shutdown``       the worker shuts down
=================  ==========================================================

Which mode implements which: ``OFF`` none (this class); ``SYNC``
(``sync.SyncSteps``) ``before_update``, ``after_update``, ``sample``;
``LANES`` (``lanes.LaneSteps``) all but ``shutdown``, its rebuilds being
``SYNC``'s. ``shutdown`` is called by the plugin's workers when they shut
down (``PPSpecRunnerMixin.ppspec_shutdown``); no mode holds anything to end
there yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_ppspec.policy import Mode
from vllm_ppspec.runner.view import RunnerView


class Steps:
    mode = Mode.OFF

    def prepare(self, view: RunnerView, scheduler_output: Any) -> None:
        pass

    def before_update(self, view: RunnerView, scheduler_output: Any) -> None:
        pass

    def after_update(self, view: RunnerView, scheduler_output: Any) -> None:
        pass

    def executed(self, view: RunnerView, scheduler_output: Any) -> None:
        pass

    def sample(self, view: RunnerView, fault_step: int, vllm_sample: Callable[[], Any]) -> Any:
        return vllm_sample()

    def sampled(self, output_token_ids: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass
