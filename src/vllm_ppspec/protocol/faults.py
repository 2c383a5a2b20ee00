"""Fault injection for tests: switches read once, when the runner is set up.

``VLLM_PPSPEC_FAULT_SKIP_STATE_REPLAY=1``: non-last ranks skip the replay of
``_update_states_after_model_execute`` (hybrid models then drift).

``VLLM_PPSPEC_FAULT=<kind>@<n>`` on non-last ranks, at their n-th step (1-based):

* ``drop_stash@n``: ``sample_tokens`` finds no stashed scheduler output or
  step rows (``MissingStashError``; async scheduling, where rounds are
  applied; with lanes at the first ``sample_tokens`` from step n on);
* ``raise@n``: ``execute_model`` raises before the forward (any mode);
* ``raise_in_round@n``: applying a received round raises (async scheduling;
  with lanes the first round of step n or later).

``VLLM_PPSPEC_FAULT=dp_disagree@n`` acts on drafter ranks instead: at DP > 1,
DP rank 1 reports one drafter forward more than it will run at its n-th
``propose`` (every DP rank then raises ``DPAgreementError``; protocol/dp_agreement.py).

These exist so that tests can show a broken invariant is caught and that an
error on a rank vLLM does not read replies from still ends the engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

SKIP_STATE_REPLAY = "VLLM_PPSPEC_FAULT_SKIP_STATE_REPLAY"
FAULT = "VLLM_PPSPEC_FAULT"
KINDS = ("drop_stash", "raise", "raise_in_round", "dp_disagree")


class InjectedFault(RuntimeError):
    """Raised by the ``raise@n`` and ``raise_in_round@n`` switches."""


@dataclass(frozen=True)
class Faults:
    skip_state_replay: bool = False
    kind: str | None = None
    at_step: int = 0

    @classmethod
    def from_env(cls) -> Faults:
        spec = os.environ.get(FAULT, "")
        kind, at = None, 0
        if spec:
            kind, _, n = spec.partition("@")
            if kind not in KINDS or not n.isdigit() or int(n) < 1:
                raise ValueError(
                    f"{FAULT}={spec!r}: expected <kind>@<step>, kind one of {KINDS}, step >= 1"
                )
            at = int(n)
        return cls(os.environ.get(SKIP_STATE_REPLAY) == "1", kind, at)

    def any(self) -> bool:
        return self.skip_state_replay or self.kind is not None

    def fires(self, kind: str, step: int) -> bool:
        return self.kind == kind and step == self.at_step

    def reached(self, kind: str, step: int) -> bool:
        """At or past the step: for async lanes, whose rounds and samples skip empty steps."""
        return self.kind == kind and step >= self.at_step
