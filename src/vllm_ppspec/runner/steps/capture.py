"""Take what vLLM sampled on the last rank where vLLM hands it on.

vLLM's ``sample_tokens`` returns a ``ModelRunnerOutput`` (lists, made for the
scheduler); the ``[num_reqs, <= k+1]`` tensor a round carries exists only as
the argument vLLM passes to ``_update_states_after_model_execute``. The
mixin's override of that method hands it to the steps object
(``Part.sampled_tensor``); the lane sender owns one :class:`SampledCapture`,
armed before vLLM's ``sample_tokens`` and read after it.
"""

from __future__ import annotations

import torch


class SampledCapture:
    def __init__(self) -> None:
        self._armed = False
        self._tensor: torch.Tensor | None = None

    def arm(self) -> None:
        """vLLM's ``sample_tokens`` starts: keep the tensor it hands on."""
        self._armed, self._tensor = True, None

    def seen(self, output_token_ids: torch.Tensor) -> None:
        if self._armed:
            self._tensor = output_token_ids

    def take(self) -> torch.Tensor:
        """The sampled tensor of the call since :meth:`arm`. If no sampler ran,
        ``[0, 1]``: the other ranks still wait for a round, and 0 rows never
        match a batch with requests, so every rank raises."""
        sampled, self._armed, self._tensor = self._tensor, False, None
        if sampled is None:
            sampled = torch.empty((0, 1), dtype=torch.int32)
        return sampled
