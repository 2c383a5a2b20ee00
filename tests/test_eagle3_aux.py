"""``eagle3_aux`` drafts from the target's first auxiliary hidden state (no engine).

The target runs in HF transformers; the drafter is emulated in plain torch after
vLLM's ``Eagle3LlamaForCausalLM`` (``llama_eagle3.py``) and the proposer's chain
(``llm_base_proposer.py``): the first pass pairs the target's auxiliary states at
positions ``0..i`` with the context shifted by one plus the sampled token, goes through
``fc``, and each later step feeds the previous step's pre-norm output back as the hidden
state, one position further on.  The only auxiliary state the drafter reads is the first
(the input of target layer 1: under PP 2|1|1 the one computed on stage 0 and relayed by
stage 1); zeroing or shifting it makes the drafts wrong.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vllm_ppspec_tools.fixtures.tiny_models import (
    EAGLE3_AUX_LAYERS,
    HEAD_DIM,
    HIDDEN,
    NUM_SPECIAL,
    ROPE_THETA,
    VOCAB_SIZE,
    greedy_reference,
    reference_acceptance,
    simulate_acceptance,
    successor_table,
)

SUCC = successor_table()
K = 3


class _Target:
    def __init__(self, path: str) -> None:
        from transformers import LlamaForCausalLM

        self.model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.embed = self.model.model.embed_tokens.weight.detach()

    @torch.no_grad()
    def run(self, ids: list[int]) -> tuple[torch.Tensor, int]:
        """(auxiliary states [T, 3H] as vLLM captures them, greedy next token)."""
        out = self.model(torch.tensor([ids]), output_hidden_states=True)
        hs = out.hidden_states  # hs[l] is the input of layer l (the full residual stream)
        aux = torch.cat([hs[layer][0] for layer in EAGLE3_AUX_LAYERS], dim=-1)
        return aux, int(out.logits[0, -1].argmax())


class _Eagle3:
    """Single-layer ``LlamaForCausalLMEagle3`` forward, greedy, one request."""

    def __init__(self, path: str, embed: torch.Tensor) -> None:
        from safetensors.torch import load_file

        self.w = load_file(str(Path(path) / "model.safetensors"))
        cfg = json.loads((Path(path) / "config.json").read_text())
        self.eps = cfg["rms_norm_eps"]
        assert cfg["norm_before_residual"] and not cfg.get("norm_before_fc")
        self.embed = embed  # vLLM shares (or hands over) the target's embedding

    def _rms(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name]

    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    @staticmethod
    def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # neox style
        inv = ROPE_THETA ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
        ang = pos[:, None, None].float() * inv
        cos, sin = ang.cos(), ang.sin()
        a, b = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def _layer(self, ids: list[int], pos: torch.Tensor, hidden: torch.Tensor, kv: list):
        """One pass over new tokens; appends their k/v to ``kv``; (logits, prenorm)."""
        p = "midlayer."
        embeds = self._rms(self.embed[ids], p + "input_layernorm.weight")
        hidden = self._rms(hidden, p + "hidden_norm.weight")  # norm_before_residual
        residual = hidden
        x = torch.cat([embeds, hidden], dim=-1)
        q = self._lin(x, p + "self_attn.q_proj").view(len(ids), -1, HEAD_DIM)
        k = self._lin(x, p + "self_attn.k_proj").view(len(ids), -1, HEAD_DIM)
        v = self._lin(x, p + "self_attn.v_proj").view(len(ids), -1, HEAD_DIM)
        kv.append((self._rope(k, pos), v, pos))
        keys = torch.cat([e[0] for e in kv])[:, 0]  # one KV head
        values = torch.cat([e[1] for e in kv])[:, 0]
        kpos = torch.cat([e[2] for e in kv])
        scores = torch.einsum("thd,sd->hts", self._rope(q, pos), keys) / HEAD_DIM**0.5
        scores = scores.masked_fill(kpos[None, None, :] > pos[None, :, None], float("-inf"))
        attn = torch.einsum("hts,sd->thd", scores.softmax(-1), values).reshape(len(ids), -1)
        residual = residual + self._lin(attn, p + "self_attn.o_proj")
        h = self._rms(residual, p + "post_attention_layernorm.weight")
        gate, up = self._lin(h, p + "mlp.gate_proj"), self._lin(h, p + "mlp.up_proj")
        prenorm = residual + self._lin(F.silu(gate) * up, p + "mlp.down_proj")
        logits = F.linear(self._rms(prenorm, "norm.weight"), self.w["lm_head.weight"])
        return logits, prenorm

    @torch.no_grad()
    def propose(self, ctx: list[int], aux: torch.Tensor, next_token: int, k: int) -> list[int]:
        kv: list = []
        n = len(ctx)
        hidden = F.linear(aux, self.w["fc.weight"])  # combine_hidden_states
        logits, prenorm = self._layer(ctx[1:] + [next_token], torch.arange(n), hidden, kv)
        drafts = [int(logits[-1].argmax())]
        for step in range(1, k):
            pos = torch.tensor([n - 1 + step])
            logits, prenorm = self._layer(drafts[-1:], pos, prenorm[-1:], kv)
            drafts.append(int(logits[-1].argmax()))
        return drafts


@pytest.fixture(scope="module")
def pair(models):
    target = _Target(models["target"])
    return target, _Eagle3(models["eagle3_aux"], target.embed)


def _contexts(n: int, seed: int = 7) -> list[list[int]]:
    """Prompts of 1-6 random ids followed by 0-30 greedy tokens of the target."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(NUM_SPECIAL, VOCAB_SIZE) for _ in range(rng.randint(1, 6))]
        out.append(prompt + greedy_reference(prompt, rng.randint(0, 30)))
    return out


def _first_drafts(pair, aux_edit) -> list[tuple[int, int, int]]:
    """(first draft, SUCC[SUCC[x_i]], target's token after the sampled one) per context."""
    target, drafter = pair
    rows = []
    for ctx in _contexts(60):
        if len(ctx) < 2:
            continue
        aux, nxt = target.run(ctx)
        assert nxt == greedy_reference(ctx, 1)[0]
        after = greedy_reference(ctx, 2)[1]
        draft = drafter.propose(ctx, aux_edit(aux), nxt, 1)[0]
        rows.append((draft, SUCC[SUCC[ctx[-1]]], after))
    return rows


def test_hf_hidden_states_are_the_layer_inputs_vllm_captures(pair):
    """HF ``hidden_states[l]`` is the input of layer ``l`` (vLLM: hidden + residual)."""
    target, _ = pair
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        layer.register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: seen.__setitem__(
                i, args[0] if args else kwargs["hidden_states"]
            ),
            with_kwargs=True,
        )
        for i, layer in enumerate(target.model.model.layers)
    ]
    try:
        with torch.no_grad():
            out = target.model(torch.tensor([[17, 300, 42, 5]]), output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    for layer in EAGLE3_AUX_LAYERS:
        assert torch.equal(out.hidden_states[layer], seen[layer])


def test_first_draft_reads_the_token_from_the_first_aux_state(pair):
    rows = _first_drafts(pair, lambda aux: aux)
    assert all(draft == want for draft, want, _ in rows)
    # The other two auxiliary states carry no weight.
    kept = _first_drafts(pair, lambda aux: torch.cat([aux[:, :HIDDEN], 0 * aux[:, HIDDEN:]], 1))
    assert [r[0] for r in kept] == [r[0] for r in rows]


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda aux: torch.cat([0 * aux[:, :HIDDEN], aux[:, HIDDEN:]], 1), id="zero"),
        pytest.param(
            lambda aux: torch.cat([aux[:, :HIDDEN].roll(1, 0), aux[:, HIDDEN:]], 1), id="shifted"
        ),
    ],
)
def test_first_draft_is_wrong_without_the_right_first_aux_state(pair, edit):
    good = _first_drafts(pair, lambda aux: aux)
    bad = _first_drafts(pair, edit)
    right_good = sum(d == after for d, _, after in good)
    right_bad = sum(d == after for d, _, after in bad)
    assert right_good >= len(good) // 3
    assert right_bad <= max(2, right_good // 10)
    assert sum(d == want for d, want, _ in bad) <= len(bad) // 10


def _acceptance(pair, prompt: list[int], max_tokens: int, aux_edit) -> tuple[int, int]:
    target, drafter = pair

    def propose(ctx: list[int]) -> list[int]:
        aux, nxt = target.run(ctx[:-1])  # the target's pass that sampled ctx[-1]
        assert nxt == ctx[-1]
        return drafter.propose(ctx[:-1], aux_edit(aux), nxt, K)

    ref = greedy_reference(prompt, max_tokens + K + 1)
    return simulate_acceptance(list(prompt), ref, max_tokens, propose)


def test_acceptance_matches_the_aux_rule_and_collapses_without_the_state(pair):
    rng = random.Random(11)
    totals = {"aux": [0, 0], "succ": [0, 0], "zero": [0, 0]}
    for _ in range(6):
        prompt = [rng.randrange(NUM_SPECIAL, VOCAB_SIZE) for _ in range(rng.randint(1, 6))]
        got = _acceptance(pair, prompt, 32, lambda aux: aux)
        assert got == reference_acceptance(prompt, 32, K, drafter="aux")
        zero = _acceptance(
            pair, prompt, 32, lambda aux: torch.cat([0 * aux[:, :HIDDEN], aux[:, HIDDEN:]], 1)
        )
        for key, (a, d) in (
            ("aux", got),
            ("succ", reference_acceptance(prompt, 32, K, "succ")),
            ("zero", zero),
        ):
            totals[key][0] += a
            totals[key][1] += d
    aux_rate = totals["aux"][0] / totals["aux"][1]
    succ_rate = totals["succ"][0] / totals["succ"][1]
    zero_rate = totals["zero"][0] / totals["zero"][1]
    print(totals)
    assert aux_rate >= 0.3 * succ_rate
    assert zero_rate <= 0.1 * aux_rate
