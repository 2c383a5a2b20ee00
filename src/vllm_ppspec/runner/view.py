"""Give the mode parts their one view of vLLM's runner, checked on the built runner.

The parts (``steps/sync.py``, ``steps/lanes.py``) reach vLLM's ``GPUModelRunner``
only through :class:`RunnerView`: the attributes and the call they need,
listed here once. vLLM sets them in ``GPUModelRunner.__init__``, so they can
be checked only on a built runner: :meth:`RunnerView.check` runs at runner
set-up and refuses a vLLM that lacks one, naming it (the class-level names
are in ``compat.data.PRIVATE_NAMES``).
"""

from __future__ import annotations

from typing import Any

# Instance attributes of vLLM's GPUModelRunner that the parts read or call.
RUNNER_ATTRIBUTES: tuple[str, ...] = (
    "requests",  # req_id -> CachedRequestState
    "input_batch",  # num_reqs, req_ids, req_id_to_index, num_accepted_tokens_cpu
    "discard_request_mask",  # .np: rows whose sample is dropped (partial prefills)
    "_draft_token_ids",  # this step's drafts on the last rank
    "_draft_token_req_ids",  # their request ids (external launcher: set on the others)
    "_get_draft_token_ids_cpu",  # () -> (drafts as lists, req ids), not taken
    "num_spec_tokens",  # k
    "take_draft_token_ids",  # () -> DraftTokenIds | None, last rank
    "use_async_scheduling",  # the runner's async flags, set to its sync path in lanes
    "use_async_spec_decode",
)


class RunnerView:
    def __init__(self, runner: Any) -> None:
        self._runner = runner

    @staticmethod
    def check(runner: Any) -> None:
        from vllm_ppspec.compat.guard import VLLMVersionError

        missing = [name for name in RUNNER_ATTRIBUTES if not hasattr(runner, name)]
        if missing:
            raise VLLMVersionError(
                "vllm-ppspec: vLLM's runner lacks " + ", ".join(missing) + " (runner/view.py)"
            )

    @property
    def requests(self) -> dict[str, Any]:
        return self._runner.requests  # type: ignore[no-any-return]

    @property
    def input_batch(self) -> Any:
        return self._runner.input_batch

    @property
    def model(self) -> Any:
        return self._runner.model

    @property
    def num_reqs(self) -> int:
        return int(self._runner.input_batch.num_reqs)

    @property
    def discard_mask(self) -> Any:
        """numpy bool ``[max_num_reqs]``: rows whose sample vLLM drops."""
        return self._runner.discard_request_mask.np

    @property
    def drafts(self) -> Any:
        """This step's draft ids on the last rank (tensor, list or None)."""
        return self._runner._draft_token_ids

    def take_drafts(self) -> Any:
        return self._runner.take_draft_token_ids()

    def drafts_no_take(self) -> list[list[int]]:
        """This step's drafts as lists, left for vLLM's own take."""
        drafts, _ = self._runner._get_draft_token_ids_cpu()
        return [list(map(int, row)) for row in drafts]

    @property
    def num_spec_tokens(self) -> int:
        return int(self._runner.num_spec_tokens)

    @property
    def accepted_counts_event(self) -> Any:
        """The event of the sampler's device-to-host copy of accepted counts, if any."""
        return getattr(self._runner, "num_accepted_tokens_event", None)

    def run_sync_path(self) -> None:
        """Each step reaches vLLM's runner as sync scheduling would send it."""
        self._runner.use_async_scheduling = False
        self._runner.use_async_spec_decode = False
