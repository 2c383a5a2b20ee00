"""Shape one round's sampled and draft matrices (pure tensors: no vLLM, no distributed).

Conventions follow vLLM's V1 rejection sampler: row ``i`` of the sampled matrix
holds the accepted draft tokens of request ``i`` followed by one bonus or
recovered token, and ``-1`` in every column after that.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

PAD_ID = -1


def pad_sampled(sampled: torch.Tensor, num_spec_tokens: int) -> torch.Tensor:
    """Return ``sampled`` as a CPU int32 ``[rows, num_spec_tokens + 1]`` matrix.

    The sampler emits fewer than ``k + 1`` columns in rounds where fewer drafts
    were scheduled (one column when no request had drafts); the missing columns
    are filled with ``-1`` so that every round has the same static shape.
    """
    if sampled.dim() != 2:
        raise ValueError(f"sampled token ids must be 2-D, got shape {tuple(sampled.shape)}")
    width = num_spec_tokens + 1
    rows, cols = sampled.shape
    if cols > width:
        raise ValueError(
            f"sampled token ids have {cols} columns, more than num_speculative_tokens + 1 = {width}"
        )
    out = torch.full((rows, width), PAD_ID, dtype=torch.int32)
    out[:, :cols] = sampled.to(device="cpu", dtype=torch.int32)
    return out


def draft_matrix(
    drafts: torch.Tensor | Sequence[Sequence[int]] | None, rows: int, num_spec_tokens: int
) -> torch.Tensor:
    """Return this round's draft ids as a CPU int32 ``[rows, num_spec_tokens]`` matrix.

    Tensor drafts (EAGLE, MTP, draft models) are copied, zero-padded on the
    right if narrower. List-form drafts (ngram and other CPU proposers) and a
    missing draft tensor travel as zeros: their real ids reach the next step
    through the scheduler, never through this matrix.
    """
    out = torch.zeros((rows, num_spec_tokens), dtype=torch.int32)
    if isinstance(drafts, torch.Tensor):
        if drafts.dim() != 2 or drafts.shape[0] != rows or drafts.shape[1] > num_spec_tokens:
            raise ValueError(
                f"draft token ids have shape {tuple(drafts.shape)}, expected at most "
                f"[{rows}, {num_spec_tokens}]"
            )
        out[:, : drafts.shape[1]] = drafts.to(device="cpu", dtype=torch.int32)
    return out
