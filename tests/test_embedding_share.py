"""The target's embedding reaches exactly the drafters vLLM shares it with.

``share_mode`` is checked against vLLM's own proposer classes; the hand-over
protocol runs on three gloo ranks (first stage holds the embedding, a middle
stage, the last stage holds the drafter), every branch in one process group:
a branch that raises must raise on every rank and leave them in step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.distributed import run_ranks
from vllm_ppspec.protocol.rounds import RoundDivergenceError
from vllm_ppspec.runner.drafter.embedding_handover import (
    EmbeddingHandoverError,
    embedding_digest,
    hand_over_embedding,
)
from vllm_ppspec.runner.drafter.embedding_share import ShareMode, share_mode


def _proposer(cls: type, model: object) -> object:
    proposer = object.__new__(cls)
    proposer.model = model  # type: ignore[attr-defined]
    return proposer


class _Head(torch.nn.Module):
    """A drafter model: ``model.embed_tokens`` (None: built without an embedding)."""

    def __init__(self, embed: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = embed  # type: ignore[assignment]


class _EagleHead(_Head):
    def __init__(self, own: bool, embed: torch.nn.Module | None = None) -> None:
        super().__init__(embed)
        self.has_own_embed_tokens = own


def _embed() -> torch.nn.Module:
    return torch.nn.Embedding(8, 4)


def test_share_mode_mirrors_vllm_decision():
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.spec_decode.gemma4 import Gemma4Proposer
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    # A draft model never shares, even a Llama that carries the EAGLE flag False.
    drafter = _proposer(DraftModelProposer, _EagleHead(own=False, embed=_embed()))
    assert share_mode(drafter) == ShareMode.NONE
    # EAGLE head without its own embedding: shared when the widths match.
    drafter = _proposer(EagleProposer, _EagleHead(own=False, embed=_embed()))
    assert share_mode(drafter) == ShareMode.SAME_WIDTH
    assert share_mode(_proposer(EagleProposer, _EagleHead(own=True))) == ShareMode.NONE
    # MTP (no flag): always shared; built without an embedding, replaced by the target's.
    assert share_mode(_proposer(EagleProposer, _Head(_embed()))) == ShareMode.ALWAYS
    assert share_mode(_proposer(EagleProposer, _Head(None))) == ShareMode.REPLACE
    # A proposer with its own sharing rule cannot be replayed across stages.
    assert share_mode(_proposer(Gemma4Proposer, _Head(_embed()))) == ShareMode.UNSUPPORTED
    assert share_mode(object.__new__(NgramProposer)) == ShareMode.NONE
    assert share_mode(None) == ShareMode.NONE


def test_share_mode_of_an_eagle_head_without_an_embedding_follows_the_vllm_version(monkeypatch):
    """vLLM 0.33's ``_maybe_share_embeddings`` shares the target's module with an
    EAGLE-flagged head built without an embedding (0.33's NemotronH MTP), any
    width; 0.32's reads its missing weight and raises, so the plugin refuses."""
    from vllm.v1.spec_decode.eagle import EagleProposer

    from vllm_ppspec.compat import guard as version_guard

    for embed in (None, torch.nn.Identity()):
        drafter = _proposer(EagleProposer, _EagleHead(own=False, embed=embed))
        monkeypatch.setattr(version_guard, "installed_vllm_version", lambda: "0.33.0")
        assert share_mode(drafter) == ShareMode.REPLACE, embed
        monkeypatch.setattr(version_guard, "installed_vllm_version", lambda: "0.32.0")
        assert share_mode(drafter) == ShareMode.UNSUPPORTED, embed


TARGET = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 7.0

# (name, mode, drafter's embedding before, expected outcome on the drafter's rank)
SCENARIOS = [
    ("no sharing", ShareMode.NONE, torch.zeros(8, 4), "keep"),
    ("mtp, other values", ShareMode.ALWAYS, torch.zeros(8, 4), "target"),
    ("mtp, same values", ShareMode.ALWAYS, TARGET.clone(), "same"),
    ("eagle, same width", ShareMode.SAME_WIDTH, torch.ones(8, 4), "target"),
    ("eagle, other width", ShareMode.SAME_WIDTH, torch.ones(8, 6), "keep"),
    ("mtp, other width", ShareMode.ALWAYS, torch.ones(8, 6), "raise"),
    ("eagle, other vocabulary", ShareMode.SAME_WIDTH, torch.ones(9, 4), "raise"),
    ("unsupported proposer", ShareMode.UNSUPPORTED, torch.ones(8, 4), "raise"),
    # no embedding of its own (the drafter asks with shape (0, 0)): the target's, any width
    ("no embedding, replaced", ShareMode.REPLACE, torch.empty(0, 0), "target"),
]


def _hand_over_all(rank: int, world: int) -> list[tuple[str, str, list | None]]:
    group = dist.group.WORLD
    out = []
    for name, mode, before, _ in SCENARIOS:
        mine = before.clone()
        try:
            got = hand_over_embedding(
                group,  # type: ignore[arg-type]
                0,
                TARGET if rank == 0 else None,
                tuple(mine.shape) if rank == world - 1 else None,  # type: ignore[arg-type]
                mode=int(mode) if rank == world - 1 else 0,
                want_digest=lambda m=mine: embedding_digest(m),  # type: ignore[misc]
            )
        except EmbeddingHandoverError as e:
            assert not isinstance(e, RoundDivergenceError)  # a load-time error, not a round's
            out.append((name, "raised", None))
            assert "embedding" in str(e)
            continue
        out.append((name, "returned", None if got is None else got.tolist()))
    dist.barrier()  # still in step after every branch
    return out


def test_hand_over_follows_the_mode_on_every_rank():
    results = run_ranks(_hand_over_all, world=3, timeout=120)
    for r in results:
        assert r.error is None and not r.hung, r.message
    for i, (name, _mode, _before, expect) in enumerate(SCENARIOS):
        outcomes = [r.value[i] for r in results]
        if expect == "raise":
            assert all(o[1] == "raised" for o in outcomes), (name, outcomes)
            continue
        assert all(o[1] == "returned" for o in outcomes), (name, outcomes)
        assert outcomes[0][2] is None and outcomes[1][2] is None, name  # senders get nothing
        got = outcomes[2][2]
        if expect == "target":
            assert got == TARGET.tolist(), name
        else:  # "keep" and "same": nothing sent, the drafter's weights stay
            assert got is None, name
