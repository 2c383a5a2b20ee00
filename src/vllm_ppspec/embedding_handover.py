"""Load-time hand-off of the target's token embedding to the drafter's PP rank.

At PP = 1 vLLM shares the target's token embedding with some drafters
(:mod:`vllm_ppspec.embedding_share` replays that decision); under PP the
embedding lives on the first stage and the drafter on the last. This module
moves it, once, after the model is loaded: pure ``torch.distributed`` on the PP
group's gloo (CPU) group, no vLLM, so it is tested with plain processes
(tests/test_embedding_share.py). The per-round protocol is in
:mod:`vllm_ppspec.transport`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
import torch.distributed as dist

from vllm_ppspec.embedding_share import ShareMode


class EmbeddingHandoverError(RuntimeError):
    """The target's embedding cannot be handed to this drafter across PP stages.

    Raised on every PP rank after the same collectives, so none is left waiting.
    """


def embedding_digest(weight: torch.Tensor) -> int:
    """A 56-bit digest of an embedding's float32 values (equal weights, equal digest)."""
    data = weight.detach().to(device="cpu", dtype=torch.float32).contiguous()
    return int.from_bytes(hashlib.blake2b(data.numpy().tobytes(), digest_size=7).digest(), "big")


def hand_over_embedding(
    group: dist.ProcessGroup,
    src: int,
    weight: torch.Tensor | None,
    want_shape: tuple[int, int] | None,
    mode: int = ShareMode.ALWAYS,
    want_digest: Callable[[], int] | None = None,
) -> torch.Tensor | None:
    """Load-time hand-off of the target's token embedding to the drafter's rank.

    Called once by every rank of the PP group. The rank holding the drafter
    passes ``mode`` (:class:`vllm_ppspec.embedding_share.ShareMode`: 0 none,
    1 always, 2 only at equal width, 3 unsupported) and, unless 0, the shape of
    its embedding; the first rank passes its ``weight``; others pass neither.
    Collectives, on every rank, in this order:

    1. ``all_reduce(MAX)`` of ``[mode, rows, cols, have_rows, have_cols]``.
       Mode 0, or mode 2 with another width: done, nothing more. Mode 3 or a
       shape vLLM could not share: every rank raises
       :class:`EmbeddingHandoverError` here.
    2. ``all_reduce(MAX)`` of ``[want_digest, have_digest]``: equal values
       (a drafter that loaded the same embedding from its checkpoint) are done.
    3. ``broadcast`` from ``src`` (the first PP rank) of the weight as float32.

    Returns the weight on the asking rank after step 3, None otherwise.
    """
    asking = want_shape is not None and mode != ShareMode.NONE
    rows, cols = want_shape if asking and want_shape is not None else (0, 0)
    have_rows, have_cols = tuple(weight.shape) if weight is not None else (0, 0)
    header = torch.tensor(
        [mode if asking else ShareMode.NONE, rows, cols, have_rows, have_cols], dtype=torch.int64
    )
    dist.all_reduce(header, op=dist.ReduceOp.MAX, group=group)
    wanted, rows, cols, have_rows, have_cols = (int(x) for x in header)
    if wanted == ShareMode.NONE:
        return None
    if wanted == ShareMode.UNSUPPORTED:
        raise EmbeddingHandoverError(
            "this drafter shares the target's token embedding in its own way "
            "(vLLM replaces its embedding module, possibly with another width), which "
            "vllm-ppspec cannot do across PP stages; run it with "
            "--pipeline-parallel-size 1 or use an EAGLE/EAGLE-3/MTP/draft_model drafter"
        )
    if wanted == ShareMode.SAME_WIDTH and cols != have_cols:
        return None  # vLLM keeps an EAGLE drafter's embedding of another width
    if (rows, cols) != (have_rows, have_cols):
        raise EmbeddingHandoverError(
            f"the drafter's token embedding has shape [{rows}, {cols}] but the target's "
            f"first PP stage holds [{have_rows}, {have_cols}]; vLLM shares the target's "
            "embedding with this drafter, so it needs the same vocabulary and hidden "
            "size, or a checkpoint that includes its own embed_tokens weight"
        )
    digests = torch.tensor(
        [
            want_digest() if asking and want_digest is not None else -1,
            embedding_digest(weight) if weight is not None else -1,
        ],
        dtype=torch.int64,
    )
    dist.all_reduce(digests, op=dist.ReduceOp.MAX, group=group)
    if int(digests[0]) == int(digests[1]) >= 0:
        return None  # the drafter already holds the target's values
    buf = (
        weight.detach().to(device="cpu", dtype=torch.float32).contiguous()
        if weight is not None
        else torch.empty((rows, cols), dtype=torch.float32)
    )
    dist.broadcast(buf, src=src, group=group)
    return buf if asking else None
