"""Send each batch's draft tokens with that batch's output.

vLLM's engine core asks the last rank for the latest drafts right after it
scheduled a batch (``EngineCore.post_step`` -> ``take_draft_token_ids``): a
blocking call that waits until that batch left the whole pipeline, and that
hands the drafts to the scheduler before the batch's sampled tokens were
processed. Under PP + speculative decoding with sync scheduling the plugin
instead has the last rank attach the drafts to the ``ModelRunnerOutput`` it
returns for the batch (:func:`attach_drafts`, runner side), and its scheduler
applies them when it processes that output (:mod:`vllm_ppspec.sched.filled`).
The output reaches the engine core pickled, attribute included.
"""

from __future__ import annotations

from typing import Any

DRAFTS_ATTR = "ppspec_draft_token_ids"
PLACEHOLDERS_ATTR = "ppspec_placeholder_drafts"


def attach_drafts(output: Any, drafts: Any, placeholders: bool = False) -> None:
    """Attach ``drafts`` (vLLM ``DraftTokenIds``) to a batch's runner output;
    ``placeholders``: draft slots the first stage fills in the next step
    (``runner/drafter/first_stage.py``)."""
    if drafts is None or output is None:
        return
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

    if output is EMPTY_MODEL_RUNNER_OUTPUT:  # a shared singleton: never mutate it
        raise RuntimeError("vllm-ppspec: drafts proposed for a batch without output")
    setattr(output, DRAFTS_ATTR, drafts)
    if placeholders:
        setattr(output, PLACEHOLDERS_ATTR, True)


def attached_drafts(output: Any) -> Any:
    """The drafts attached to a runner output, or None."""
    return getattr(output, DRAFTS_ATTR, None)


def placeholders_attached(output: Any) -> bool:
    """The attached drafts are slots for the first stage's drafts."""
    return bool(getattr(output, PLACEHOLDERS_ATTR, False))
