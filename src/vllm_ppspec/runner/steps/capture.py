"""Take what vLLM sampled on the last rank where vLLM hands it on.

vLLM's ``sample_tokens`` returns a ``ModelRunnerOutput`` (lists, made for the
scheduler); the ``[num_reqs, <= k+1]`` tensor a round carries exists only as
the argument vLLM passes to ``_update_states_after_model_execute``. The
mixin's override of that method hands it to the steps object
(``Steps.sampled``); the lanes' steps own one :class:`SampledCapture` and read
it around their call of vLLM's ``sample_tokens``. Outside that call nothing is
kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class SampledCapture:
    def __init__(self) -> None:
        self._armed = False
        self._tensor: torch.Tensor | None = None

    def seen(self, output_token_ids: torch.Tensor) -> None:
        if self._armed:
            self._tensor = output_token_ids

    def around(self, vllm_sample: Callable[[], Any]) -> tuple[Any, torch.Tensor]:
        """vLLM's output and the sampled tensor it produced. If no sampler ran,
        ``[0, 1]``: the other ranks still wait for a round, and 0 rows never
        match a batch with requests, so every rank raises."""
        self._armed, self._tensor = True, None
        try:
            output = vllm_sample()
        finally:
            self._armed = False
        sampled, self._tensor = self._tensor, None
        if sampled is None:
            sampled = torch.empty((0, 1), dtype=torch.int32)
        return output, sampled
