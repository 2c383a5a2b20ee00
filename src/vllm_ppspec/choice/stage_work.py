"""What each PP stage reads and holds per step, estimated from the configs' sizes.

The layer split (:mod:`.layer_split`) balances these. At the batch sizes of
decoding a forward pass costs about its weights read, whatever the tokens (on
this machine a SmolLM2 layer over 4 and over 64 rows: 0.7 and 4.8 ms, its LM
head 12.1 and 44.9 ms; the bench's one-layer draft model, 3 passes, about 3.5
target layers), so work is counted in parameters read:

* a target layer: its weights (attention, MLP; a MoE layer's routed and
  shared experts per token);
* the target's LM head (last stage): vocabulary x hidden;
* the drafter (last stage, or the first where the draft model runs there:
  runner/drafter/first_stage.py): a model drafter's k passes, each its layers
  and its LM head; medusa's k heads; ngram, suffix and a user's proposer class
  none.

No estimate (None: vLLM's split) for hybrid, attention-free and multimodal
targets, and wherever a size it needs is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Proposers with no model forward on the last stage.
NO_MODEL_METHODS = frozenset({"ngram", "ngram_gpu", "suffix", "custom_class"})


@dataclass(frozen=True)
class Stages:
    """Work: weights read per step; weights: parameters held (both in parameters)."""

    layer_work: float
    layer_weights: float
    last_work: float  # the LM head, and the drafter unless it runs on the first stage
    last_weights: float
    first_weights: float  # the embedding, and the drafter where it runs there
    first_work: float = 0.0  # the drafter where it runs on the first stage


def _size(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def layer_sizes(config: Any) -> tuple[int, int] | None:
    """(active weights, all weights) of one decoder layer of ``config``, or None."""
    hidden = _size(config, "hidden_size")
    heads = _size(config, "num_attention_heads")
    if hidden is None or heads is None:
        return None
    kv_heads = _size(config, "num_key_value_heads") or heads
    head_dim = _size(config, "head_dim") or hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    routed = _size(config, "num_experts_per_tok", "moe_topk")
    expert = _size(config, "moe_intermediate_size")
    if routed and expert:
        experts = _size(config, "n_routed_experts", "num_experts", "num_local_experts") or routed
        shared = (_size(config, "n_shared_experts") or 0) * expert + (
            _size(config, "shared_expert_intermediate_size") or 0
        )
        active = 3 * hidden * (routed * expert + shared)
        held = 3 * hidden * (experts * expert + shared)
        return attention + active, attention + held
    inner = _size(config, "intermediate_size")
    if inner is None:
        return None
    return attention + 3 * hidden * inner, attention + 3 * hidden * inner


def _drafter(spec: Any, k: int) -> tuple[float, float] | None:
    """(weights read per step, weights held) of the drafter on the last stage."""
    method = str(spec.method)
    if method in NO_MODEL_METHODS:
        return 0.0, 0.0
    draft = getattr(spec, "draft_model_config", None)
    config = getattr(draft, "hf_text_config", None) or getattr(draft, "hf_config", None)
    hidden = _size(config, "hidden_size")
    vocab = _size(config, "draft_vocab_size", "vocab_size")
    if config is None or hidden is None or vocab is None:
        return None
    head = vocab * hidden
    if method == "medusa":
        blocks = _size(config, "num_hidden_layers") or 1
        per_head = blocks * hidden * hidden + head
        return k * per_head, k * per_head
    sizes = layer_sizes(config)
    layers = _size(config, "num_nextn_predict_layers", "n_predict", "num_hidden_layers") or 1
    if sizes is None:
        return None
    fc = {"eagle": 2, "eagle3": 3, "mtp": 2}.get(method, 0) * hidden * hidden
    body = layers * sizes[0] + fc
    return k * (body + head), layers * sizes[1] + fc + head


def estimate(vllm_config: Any, first: bool | None = None) -> Stages | None:
    """The stages' work and weights for this config, or None where the plugin
    keeps vLLM's split (see the module docstring); ``first``: the draft model
    on the first stage (None: where the plan puts it)."""
    model = vllm_config.model_config
    spec = vllm_config.speculative_config
    if spec is None or any(
        getattr(model, flag, False)
        for flag in ("is_hybrid", "is_attention_free", "is_multimodal_model")
    ):
        return None
    config = model.hf_text_config
    sizes = layer_sizes(config)
    hidden = _size(config, "hidden_size")
    vocab = _size(config, "vocab_size")
    k = int(spec.num_speculative_tokens or 0)
    drafter = _drafter(spec, k)
    if sizes is None or hidden is None or vocab is None or drafter is None or k <= 0:
        return None
    head = vocab * hidden
    if drafter_on_first_stage(vllm_config) if first is None else first:
        return Stages(
            layer_work=sizes[0],
            layer_weights=sizes[1],
            last_work=head,
            last_weights=head,
            first_weights=head + drafter[1],
            first_work=drafter[0],
        )
    return Stages(
        layer_work=sizes[0],
        layer_weights=sizes[1],
        last_work=head + drafter[0],
        last_weights=head + drafter[1],
        first_weights=head,
    )


def drafter_on_first_stage(vllm_config: Any) -> bool:
    """The draft model runs on the first stage: the plan's decision, which the
    runner follows (runner/drafter/first_stage.py)."""
    from vllm_ppspec.choice.plan import plan_of

    return plan_of(vllm_config).drafter_first
