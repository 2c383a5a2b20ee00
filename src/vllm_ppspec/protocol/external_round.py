"""One step's round in external-launcher mode, as one static int32 matrix (pure tensors).

Row 0 holds the step's request count ``n`` in column 0. Rows ``1 .. n`` hold,
for each request in the runner's batch order, its sampled tokens (``k + 1``
columns, ``-1`` after the last; vLLM's rejection-sampler layout) and then its
drafts for the next step (``k`` columns, ``-1`` after the last). The matrix is
``[capacity + 1, 2k + 1]`` whatever the step, so a broadcast of it never
needs its shape agreed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_ppspec.protocol.accounting import PAD_ID


def round_shape(capacity: int, k: int) -> tuple[int, int]:
    return capacity + 1, 2 * k + 1


def pack_round(
    sampled: torch.Tensor, drafts: Sequence[Sequence[int]], capacity: int, k: int
) -> torch.Tensor:
    """The matrix of a step: ``sampled`` ``[n, <= k + 1]`` (``-1``-padded),
    ``drafts`` one list per request (at most ``k`` each; none if no request drafted)."""
    n, width = sampled.shape
    if n > capacity or width > k + 1:
        raise ValueError(f"a round of {n} x {width} sampled tokens exceeds [{capacity}, {k + 1}]")
    if drafts and len(drafts) != n:
        raise ValueError(f"{len(drafts)} draft rows for {n} requests")
    out = torch.full(round_shape(capacity, k), PAD_ID, dtype=torch.int32)
    out[0, 0] = n
    out[1 : n + 1, :width] = sampled.to(device="cpu", dtype=torch.int32)
    for i, row in enumerate(drafts):
        if len(row) > k:
            raise ValueError(f"request {i} has {len(row)} drafts, more than k={k}")
        if row:
            out[1 + i, k + 1 : k + 1 + len(row)] = torch.tensor(list(row), dtype=torch.int32)
    return out


def unpack_round(matrix: torch.Tensor, k: int) -> tuple[torch.Tensor, list[list[int]]]:
    """(sampled ``[n, k + 1]`` with ``-1`` padding, drafts one list per request)."""
    n = int(matrix[0, 0])
    rows = matrix[1 : n + 1]
    drafts = [[int(t) for t in row if t != PAD_ID] for row in rows[:, k + 1 :].tolist()]
    return rows[:, : k + 1].clone(), drafts
