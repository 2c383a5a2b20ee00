"""Fault-injection switches for tests, read once when the runner is set up.

``VLLM_PPSPEC_FAULT_SKIP_ACCEPTED_COUNTS=1`` (:data:`SKIP_ACCEPTED_COUNTS`):
non-last ranks do not restore hybrid models' accepted counts
(``steps/hybrid.RestoreAcceptedCounts`` is not built there), so their hybrid state drifts.

``VLLM_PPSPEC_FAULT=<kind>@<n>`` on non-last ranks, at their n-th step (1-based):

* ``drop_rows@n`` (lanes): ``sample_tokens`` loses the step rows its
  ``execute_model`` left for it and raises ``MissingRowsError``, at the
  first ``sample_tokens`` from step n on;
* ``raise@n``: ``execute_model`` raises before the forward (any mode);
* ``raise_in_round@n`` (lanes): receiving a round raises, at the first round
  of step n or later.

``VLLM_PPSPEC_FAULT=dp_disagree@n`` acts on drafter ranks instead: at DP > 1,
DP rank 1 reports one drafter forward more than it will run at its n-th
``propose`` (every DP rank then raises ``DPAgreementError``; protocol/dp_agreement.py).

Tests use them to show that a broken invariant is caught and that an error on
a rank vLLM does not read replies from ends the engine. They reach the runner's
parts when the parts are built (``runner/steps/build.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

SKIP_ACCEPTED_COUNTS = "VLLM_PPSPEC_FAULT_SKIP_ACCEPTED_COUNTS"
FAULT = "VLLM_PPSPEC_FAULT"
KINDS = ("drop_rows", "raise", "raise_in_round", "dp_disagree")


class InjectedFault(RuntimeError):
    """Raised by the ``raise@n`` and ``raise_in_round@n`` switches."""


@dataclass(frozen=True)
class Faults:
    """The switches above, as read from the environment."""

    skip_accepted_counts: bool = False
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
        return cls(os.environ.get(SKIP_ACCEPTED_COUNTS) == "1", kind, at)

    def any(self) -> bool:
        return self.skip_accepted_counts or self.kind is not None

    def fires(self, kind: str, step: int) -> bool:
        return self.kind == kind and step == self.at_step

    def reached(self, kind: str, step: int) -> bool:
        """At or past the step: for async lanes, whose rounds and samples skip empty steps."""
        return self.kind == kind and step >= self.at_step
