"""The first stage's drafts on the wire: one int64 tensor in a step's intermediate tensors.

The first PP rank drafts (runner/drafter/first_stage.py) and puts the drafts of
the step's requests with draft slots, in the scheduler's order, under
:data:`KEY` in the tensors vLLM sends rank to rank; each later rank takes them
out before vLLM reads the tensors. Format: ``[n, k, d_00 .. d_0k-1, ...]``,
-1 padded (:func:`encode`, :func:`decode`). No vLLM import.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

KEY = "ppspec_draft_token_ids"


def with_slots(scheduled: dict[str, Any]) -> list[str]:
    """The step's requests with draft slots, in the scheduler's order (every rank's)."""
    return [r for r, ids in scheduled.items() if ids]


def encode(drafts: dict[str, list[int]], k: int, tp: int = 1) -> torch.Tensor:
    """``[n, k, d_00 .. d_0k-1, ...]``, -1 padded: never empty (tensor dicts skip empty).

    With ``tp`` > 1 one more -1 where the length divides by ``tp``: vLLM's PP
    send (``GroupCoordinator.isend_tensor_dict`` with the TP group as
    ``all_gather_group``) sends each TP rank a slice of a tensor whose size
    divides by the TP size, and the receiver all-gathers the slices over the TP
    group's device communicator, which takes device tensors only (CUDA). The
    drafts are a CPU tensor: sent whole, over the PP group's ``cpu_group``."""
    n = len(drafts)
    body = np.full((n, k), -1, dtype=np.int64)
    for i, ids in enumerate(drafts.values()):
        body[i, : len(ids)] = ids
    pad = [-1] if tp > 1 and (2 + n * k) % tp == 0 else []
    return torch.from_numpy(np.concatenate([[n, k], body.ravel(), pad]).astype(np.int64))


def decode(tensor: torch.Tensor, req_ids: list[str]) -> dict[str, list[int]]:
    """The drafts of ``req_ids`` (the step's draft slots, in the scheduler's order)."""
    flat = tensor.to("cpu").tolist()
    n, k = int(flat[0]), int(flat[1])
    if n != len(req_ids):
        raise RuntimeError(
            f"vllm-ppspec: the first stage drafted for {n} requests, this step has "
            f"{len(req_ids)} with draft slots"
        )
    rows = [flat[2 + i * k : 2 + (i + 1) * k] for i in range(n)]
    return {r: [t for t in row if t >= 0] for r, row in zip(req_ids, rows, strict=True)}
