"""The target's layer split between PP stages, balanced for speculative decoding.

Besides its share of the target's layers, the last PP stage runs the target's
LM head over every verified position (k + 1 per request) and the drafter; vLLM
splits the layers evenly (``vllm.distributed.utils.get_pp_indices``), so under
PP + spec the last stage sets the pace and the others wait
(docs/measurements.md, "Balanced stages"). On the lines the plugin serves at
PP > 1, where ``VLLM_PP_LAYER_PARTITION`` is not set, each worker sets that
variable (vLLM's own knob, read when the model is built) to the split whose
stages' estimated work per step is most equal, before vLLM builds anything
that reads it. The user's ``VLLM_PP_LAYER_PARTITION`` always wins; every PP
rank computes the same split from the same configs, and the start-up check
compares it (``runner/health/startup_check.py``).

The estimate counts the weights each stage reads per step, from the configs'
sizes (no timing, so every host computes the same): at the batch sizes of
decoding a forward pass costs about its weights read, whatever the tokens (on
this machine a SmolLM2 layer over 4 and over 64 rows: 0.7 and 4.8 ms, its LM
head 12.1 and 44.9 ms; the bench's one-layer draft model, 3 passes, about 3.5
target layers).

* a target layer: its weights (attention, MLP; a MoE layer's routed and
  shared experts per token);
* the target's LM head (last stage): vocabulary x hidden;
* the drafter (last stage, or the first where the draft model runs there:
  runner/drafter/first_stage.py): a model drafter's k passes, each its layers
  and its LM head; medusa's k heads; ngram, suffix and a user's proposer class
  none.

A split is allowed only if no stage holds more weights than the heaviest stage
of vLLM's even split, so a model that fits evenly still fits. The estimate is
left out (vLLM's split) for hybrid, attention-free and multimodal targets, and
wherever a size it needs is missing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

# Under vLLM's "vllm" logger, whose handler prints INFO lines in every process
# (a logger outside it prints only warnings: the chosen split would go unseen).
logger = logging.getLogger("vllm.ppspec")

ENV = "VLLM_PP_LAYER_PARTITION"

# Proposers with no model forward on the last stage.
NO_MODEL_METHODS = frozenset({"ngram", "ngram_gpu", "suffix", "custom_class"})

# The value this process set, so that a later config of the same process (an
# external launcher, a second vllm.LLM) recomputes it instead of taking it for
# the user's.
_set_here: str | None = None


@dataclass(frozen=True)
class Stages:
    """Work: weights read per step; weights: parameters held (both in parameters)."""

    layer_work: float
    layer_weights: float
    last_work: float  # the LM head, and the drafter unless it runs on the first stage
    last_weights: float
    first_weights: float  # the embedding, and the drafter where it runs there
    first_work: float = 0.0  # the drafter where it runs on the first stage


def even_split(num_layers: int, pp: int) -> list[int]:
    """vLLM's split with ``VLLM_PP_LAYER_PARTITION`` unset, from vLLM's own
    ``get_pp_indices`` (the variable must be unset while this runs)."""
    from vllm.distributed.utils import get_pp_indices

    return [end - start for start, end in (get_pp_indices(num_layers, r, pp) for r in range(pp))]


def _spread(layers: int, stages: int) -> list[int]:
    """``layers`` over ``stages`` as evenly as vLLM spreads them: any remainder
    on the later stages."""
    base, rest = divmod(layers, stages)
    return [base + (1 if i >= stages - rest else 0) for i in range(stages)]


def choose(
    num_layers: int, pp: int, stages: Stages, even: list[int], weight_limit: bool = True
) -> list[int]:
    """The split with the least work on its busiest stage, among those whose
    heaviest stage holds no more weights than ``even``'s (any, without
    ``weight_limit``); ties go to the split nearest ``even``."""

    def work(split: list[int]) -> float:
        loads = [n * stages.layer_work for n in split]
        loads[0] += stages.first_work
        loads[-1] += stages.last_work
        return max(loads)

    def weights(split: list[int]) -> float:
        held = [n * stages.layer_weights for n in split]
        held[0] += stages.first_weights
        held[-1] += stages.last_weights
        return max(held)

    def distance(split: list[int]) -> int:
        return sum(abs(a - b) for a, b in zip(split, even, strict=True))

    limit = weights(even) * (1 + 1e-9) if weight_limit else float("inf")
    ends = range(1, num_layers - pp + 2)
    candidates = (
        [even]
        + [_spread(num_layers - last, pp - 1) + [last] for last in ends]
        + [[first] + _spread(num_layers - first, pp - 1) for first in ends]
    )
    allowed = [s for s in candidates if weights(s) <= limit]
    return min(allowed, key=lambda s: (work(s), distance(s)))


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


def estimate(vllm_config: Any) -> Stages | None:
    """The stages' work and weights for this config, or None where the plugin
    keeps vLLM's split (see the module docstring)."""
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
    if drafter_on_first_stage(vllm_config):
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
    """The draft model runs on the first stage (``policy.drafter_placement_of``, as the
    runner decides: runner/drafter/first_stage.py)."""
    from vllm_ppspec.choice import policy

    return policy.drafter_placement_of(vllm_config) is None


def split_for(vllm_config: Any, weight_limit: bool = True) -> tuple[list[int], list[int]] | None:
    """(the plugin's split, vLLM's even split) for this config, or None where
    the plugin keeps vLLM's. ``VLLM_PP_LAYER_PARTITION`` must be unset."""
    pp = int(vllm_config.parallel_config.pipeline_parallel_size)
    stages = estimate(vllm_config)
    if pp <= 1 or stages is None:
        return None
    layers = int(vllm_config.model_config.get_total_num_hidden_layers())
    even = even_split(layers, pp)
    return choose(layers, pp, stages, even, weight_limit), even


def _hint(vllm_config: Any, split: list[int] | None) -> str:
    """Where the weight limit held the split back: the split the work alone
    would choose, for the user to set if it fits."""
    free = split_for(vllm_config, weight_limit=False)
    if free is None or free[0] == (split or free[1]):
        return ""
    value = ",".join(str(n) for n in free[0])
    return (
        f"; the work alone would split {value}, with more weights on a stage than "
        f"vLLM's even split puts on any: set {ENV}={value} where that fits"
    )


def apply(vllm_config: Any) -> str | None:
    """In the plugin's worker, before vLLM builds the runner and the model: on a
    line the plugin serves at PP > 1, set ``VLLM_PP_LAYER_PARTITION`` to the
    balanced split, unless the user set it. Returns the split in force there
    (None: vLLM's even split, or not such a line)."""
    global _set_here
    from vllm_ppspec.choice.plan import plan_of

    if not plan_of(vllm_config).serves_pp:
        return None
    current = os.environ.get(ENV)
    if current is not None and current != _set_here:
        logger.info("vllm-ppspec: target layers split %s (%s, as set)", current, ENV)
        return current
    os.environ.pop(ENV, None)
    _set_here = None
    chosen = split_for(vllm_config)
    if chosen is None or chosen[0] == chosen[1]:
        logger.info(
            "vllm-ppspec: target layers split evenly (vLLM's split)%s",
            _hint(vllm_config, None) if chosen else "",
        )
        return None
    split, even = chosen
    value = ",".join(str(n) for n in split)
    os.environ[ENV] = value
    _set_here = value
    logger.info(
        "vllm-ppspec: target layers split %s over %d PP stages instead of vLLM's %s: the "
        "last stage also runs the LM head over k+1 positions, and the %s drafter runs on "
        "the %s stage; set %s to choose the split%s",
        value,
        len(split),
        ",".join(str(n) for n in even),
        vllm_config.speculative_config.method,
        "first" if drafter_on_first_stage(vllm_config) else "last",
        ENV,
        _hint(vllm_config, split),
    )
    return value
