"""Load-time hand-off of the target's token embedding to the drafter's PP rank.

At PP = 1 vLLM shares the target's token embedding with some drafters
(:mod:`vllm_ppspec.runner.drafter.embedding_share` replays that decision); under PP the
embedding lives on the first stage and the drafter on the last. This module
moves it, once, after the model is loaded: :func:`hand_over_embedding` is pure
``torch.distributed`` on the PP group's gloo (CPU) group, no vLLM, so it is
tested with plain processes (tests/test_embedding_share.py);
:func:`give_drafter_the_target_embedding` is the runner's call of it. The per-round protocol is in
:mod:`vllm_ppspec.protocol.rounds`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from vllm_ppspec.runner.drafter.embedding_share import ShareMode, drafter_embedding, share_mode

logger = logging.getLogger("vllm.ppspec")


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
    passes ``mode`` (:class:`vllm_ppspec.runner.drafter.embedding_share.ShareMode`: 0 none,
    1 always, 2 only at equal width, 3 unsupported, 4 replace) and, unless 0,
    the shape of its embedding ((0, 0) for 4: it has none); the first rank
    passes its ``weight``; others pass neither.
    Collectives, on every rank, in this order:

    1. ``all_reduce(MAX)`` of ``[mode, rows, cols, have_rows, have_cols]``.
       Mode 0, or mode 2 with another width: done, nothing more. Mode 3 or a
       shape vLLM could not share: every rank raises
       :class:`EmbeddingHandoverError` here. Mode 4 goes to step 3 with the
       first rank's shape.
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
            "this drafter shares the target's token embedding in a way vllm-ppspec "
            "cannot replay across PP stages (a proposer with its own sharing rule, which "
            "may change the width; a drafter without an embedding under tensor "
            "parallelism; or, on vLLM 0.32, an EAGLE head without an embedding weight, "
            "which vLLM 0.32 itself fails on); run it with --pipeline-parallel-size 1 "
            "or use an EAGLE/EAGLE-3/MTP/draft_model drafter"
        )
    if wanted == ShareMode.SAME_WIDTH and cols != have_cols:
        return None  # vLLM keeps an EAGLE drafter's embedding of another width
    if wanted == ShareMode.REPLACE:
        return _broadcast_weight(group, src, weight, (have_rows, have_cols), asking)
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
    return _broadcast_weight(group, src, weight, (rows, cols), asking)


def _broadcast_weight(
    group: dist.ProcessGroup,
    src: int,
    weight: torch.Tensor | None,
    shape: tuple[int, int],
    asking: bool,
) -> torch.Tensor | None:
    """Step 3 of :func:`hand_over_embedding`: the first rank's weight, as float32."""
    buf = (
        weight.detach().to(device="cpu", dtype=torch.float32).contiguous()
        if weight is not None
        else torch.empty(shape, dtype=torch.float32)
    )
    dist.broadcast(buf, src=src, group=group)
    return buf if asking else None


def give_drafter_the_target_embedding(runner: Any, pp: Any, is_last: bool) -> None:
    """Give the last rank's drafter the target's token embedding where vLLM would.

    At PP = 1 vLLM shares the target's embedding with some drafters; under PP
    it skips that and the embedding lives on the first stage. The last rank
    replays vLLM's decision (``share_mode``: EAGLE/MTP heads, never a draft
    model) and the first rank sends the weights if the drafter does not hold
    them already. Every PP rank calls this once, after vLLM's own load.
    """
    mode = ShareMode.NONE
    want_shape = None
    drafter_embed = None
    if is_last:
        drafter = getattr(runner, "drafter", None)
        mode = share_mode(drafter)
        drafter_embed = drafter_embedding(drafter)
        weight = getattr(drafter_embed, "weight", None)
        if mode == ShareMode.REPLACE:
            # vLLM puts the target's module in place of the missing one; here a
            # plain embedding of the handed-over weight, which holds the whole
            # vocabulary only without tensor parallelism.
            tp = runner.vllm_config.parallel_config.tensor_parallel_size
            mode, want_shape = (mode, (0, 0)) if tp == 1 else (ShareMode.UNSUPPORTED, (0, 0))
        elif mode != ShareMode.NONE:
            if mode != ShareMode.UNSUPPORTED and isinstance(weight, torch.Tensor):
                want_shape = (int(weight.shape[0]), int(weight.shape[1]))
            else:  # includes a drafter without an embedding module to copy into
                mode, want_shape = ShareMode.UNSUPPORTED, (0, 0)
    target_weight = None
    if pp.is_first_rank:
        model = runner.model
        language_model = (
            model.get_language_model() if hasattr(model, "get_language_model") else model
        )
        inner = getattr(language_model, "model", None)
        embed = getattr(inner, "embed_tokens", None) or getattr(inner, "embedding", None)
        target_weight = getattr(embed, "weight", None)
    weight = hand_over_embedding(
        pp.cpu_group,
        pp.first_rank,
        target_weight,
        want_shape,
        mode=int(mode),
        want_digest=lambda: embedding_digest(drafter_embed.weight),  # type: ignore[union-attr]
    )
    if weight is not None and mode == ShareMode.REPLACE:
        dtype = next(runner.drafter.model.parameters()).dtype
        module = torch.nn.Embedding.from_pretrained(
            weight.to(device=runner.device, dtype=dtype), freeze=True
        )
        runner.drafter.model.model.embed_tokens = module
        logger.info(
            "vllm-ppspec: drafter without an embedding uses the target's from PP rank 0 %s",
            tuple(weight.shape),
        )
    elif weight is not None and drafter_embed is not None:
        with torch.no_grad():
            drafter_embed.weight.copy_(weight.to(drafter_embed.weight.dtype))
        logger.info(
            "vllm-ppspec: drafter uses the target's token embedding from PP rank 0 %s",
            tuple(weight.shape),
        )
