"""A benchmark target whose forward pass dominates: Llama, hidden 1024 x 8 layers, fp32.

Greedy output is planted so that prompt-lookup (ngram) drafting is usually
right: the token embeddings are random near-orthogonal vectors, ``lm_head`` row
``u`` is the embedding of ``PRED[u]``, and every layer's weights are small, so
the last hidden state points at the current token and greedy decoding follows
``next = SUCC[t]``. ``SUCC`` is a permutation made of short cycles (16 ids
each): after one cycle the output repeats itself and ngram drafts match. The
layers still run at full size, so a step costs what a real model of this shape
costs. Built once from fixed seeds and cached like the tiny fixtures.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from vllm_ppspec.testing.tiny_models import (
    BOS_ID,
    EOS_ID,
    NUM_SPECIAL,
    VOCAB_SIZE,
    _write_fixture,
    build_cached,
)

VERSION = "bench-target-v1"
MARKER = ".bench_target_complete"
NAME = "bench_target"
DRAFTER_NAME = "bench_drafter"

HIDDEN = 1024
LAYERS = 8
HEADS = 16
HEAD_DIM = 64
INTERMEDIATE = 2816
CYCLE = 16
_LAYER_STD = 0.002  # small next to the embedding (entries of magnitude ~1)


def successor() -> list[int]:
    """``SUCC[t]`` for every id: cycles of :data:`CYCLE` over the non-special ids."""
    gen = torch.Generator().manual_seed(7001)
    ids = (torch.randperm(VOCAB_SIZE - NUM_SPECIAL, generator=gen) + NUM_SPECIAL).tolist()
    succ = list(range(VOCAB_SIZE))
    for start in range(0, len(ids), CYCLE):
        cycle = ids[start : start + CYCLE]
        for i, t in enumerate(cycle):
            succ[t] = cycle[(i + 1) % len(cycle)]
    return succ


def greedy_reference(prompt: list[int], max_tokens: int) -> list[int]:
    succ = successor()
    out, t = [], prompt[-1]
    for _ in range(max_tokens):
        t = succ[t]
        out.append(t)
    return out


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7002)
    emb = torch.randn(VOCAB_SIZE, HIDDEN, generator=gen)
    succ = successor()
    head = torch.zeros(VOCAB_SIZE, HIDDEN)
    for t in range(NUM_SPECIAL, VOCAB_SIZE):
        head[succ[t]] = emb[t] / emb[t].norm() * 4.0
    sd = {"model.embed_tokens.weight": emb, "lm_head.weight": head}

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * _LAYER_STD

    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        sd[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
        sd[p + "self_attn.q_proj.weight"] = w(HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.k_proj.weight"] = w(HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.v_proj.weight"] = w(HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.o_proj.weight"] = w(HIDDEN, HEADS * HEAD_DIM)
        sd[p + "mlp.gate_proj.weight"] = w(INTERMEDIATE, HIDDEN)
        sd[p + "mlp.up_proj.weight"] = w(INTERMEDIATE, HIDDEN)
        sd[p + "mlp.down_proj.weight"] = w(HIDDEN, INTERMEDIATE)
    sd["model.norm.weight"] = torch.ones(HIDDEN)
    return sd


def _config(layers: int = LAYERS) -> dict[str, Any]:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        architectures=["LlamaForCausalLM"],
        dtype="float32",
    ).to_dict()


def _write(out: Path) -> None:
    _write_fixture(out, _config(), _tensors())


def _write_drafter(out: Path) -> None:
    """The target cut to its first layer: same embedding, norm and head."""
    keep = {
        k: v
        for k, v in _tensors().items()
        if not k.startswith("model.layers.") or k.startswith("model.layers.0.")
    }
    _write_fixture(out, _config(layers=1), keep)


def build(root: str | os.PathLike[str]) -> str:
    """Build (or reuse) the benchmark target under ``root``; returns its path."""
    root_path = Path(root).resolve()
    root_path.mkdir(parents=True, exist_ok=True)
    return str(build_cached(root_path, NAME, _write, MARKER, VERSION))


def build_drafter(root: str | os.PathLike[str]) -> str:
    """Build (or reuse) the target's one-layer drafter (a ``draft_model`` for the
    bench's async runs: ngram cannot run under async scheduling in vLLM 0.32).
    Its layers are as small as the target's, so it plants the same successor."""
    root_path = Path(root).resolve()
    root_path.mkdir(parents=True, exist_ok=True)
    return str(build_cached(root_path, DRAFTER_NAME, _write_drafter, MARKER, VERSION))
