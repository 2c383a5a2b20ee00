"""Which drafters use the target's token embedding: vLLM's own decision, under PP.

At PP = 1 vLLM decides, after loading the drafter, whether the drafter uses
the target's token embedding (``SpecDecodeBaseProposer._maybe_share_embeddings``
in ``vllm/v1/spec_decode/llm_base_proposer.py``); under PP it skips that
decision ("loaded separately"), because the embedding lives on the first stage.
:func:`share_mode` replays the decision on the last rank so that the runner can
hand over exactly the embeddings vLLM would have shared, and nothing else:

* ``DraftModelProposer._maybe_share_embeddings`` (``draft_model.py``) does
  nothing: a draft model always keeps its own weights (any width) -> ``NONE``.
* base rule, drafter model with ``has_own_embed_tokens`` (EAGLE / EAGLE-3):
  shared when the checkpoint had no embedding, and only when the widths match
  -> ``SAME_WIDTH`` (a width mismatch keeps the drafter's, as vLLM does). A
  checkpoint with its own embedding keeps it -> ``NONE`` (vLLM shares it only
  when it is identical to the target's, which changes no value).
  A drafter built without an embedding (``embed_tokens`` None or without a
  ``weight``, e.g. 0.33's NemotronH MTP): vLLM 0.33 replaces its module by the
  target's whatever the width -> ``REPLACE``; vLLM 0.32 raises reading the
  missing weight at PP = 1 -> ``UNSUPPORTED``.
* base rule, drafter model without that attribute (MTP): always shared
  -> ``ALWAYS``; without an embedding of its own -> ``REPLACE`` (vLLM 0.32 and
  0.33 both put the target's module in its place).
* any other override of ``_maybe_share_embeddings`` (Gemma4 MTP: shares an
  embedding of another width by design) -> ``UNSUPPORTED``: the hand-over
  copies weights into the drafter's own module and cannot change its width.

The hashes of the two upstream functions mirrored here are pinned in
:data:`vllm_ppspec.compat.guard.MIRRORED_FUNCTIONS`.
"""

from __future__ import annotations

import enum
from typing import Any

import torch


class ShareMode(enum.IntEnum):
    """Values travel in the hand-over header (embedding_handover.hand_over_embedding)."""

    NONE = 0
    ALWAYS = 1
    SAME_WIDTH = 2
    UNSUPPORTED = 3
    REPLACE = 4  # the drafter has no embedding: it gets the target's, any width


def share_mode(drafter: Any) -> ShareMode:
    """vLLM's PP = 1 embedding decision for ``drafter`` (a proposer instance)."""
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    if drafter is None or not isinstance(drafter, SpecDecodeBaseProposer):
        return ShareMode.NONE  # ngram, suffix, ...: no model, no embedding
    impl = type(drafter)._maybe_share_embeddings
    if impl is DraftModelProposer._maybe_share_embeddings:
        return ShareMode.NONE
    if impl is not SpecDecodeBaseProposer._maybe_share_embeddings:
        return ShareMode.UNSUPPORTED
    from vllm_ppspec.compat.guard import vllm_at_least

    model = drafter.model
    weightless = not isinstance(getattr(drafter_embedding(drafter), "weight", None), torch.Tensor)
    if hasattr(model, "has_own_embed_tokens"):
        if model.has_own_embed_tokens:
            return ShareMode.NONE
        if weightless:
            return ShareMode.REPLACE if vllm_at_least("0.33.0") else ShareMode.UNSUPPORTED
        return ShareMode.SAME_WIDTH
    return ShareMode.REPLACE if weightless else ShareMode.ALWAYS


def drafter_embedding(drafter: Any) -> Any:
    """The drafter's embedding module (``model.model.embed_tokens``), or None."""
    inner = getattr(getattr(drafter, "model", None), "model", None)
    return getattr(inner, "embed_tokens", None)
