"""The measured layer split: each stage times a decoder layer's work, the first rank splits.

Under ``VLLM_PPSPEC_LAYER_SPLIT=measured`` (``choice/layer_split.py``), where the
user left ``VLLM_PP_LAYER_PARTITION`` unset, at the runner's set-up (after the
start-up check, which compares the rule and that variable; before the model
is built, which reads the split):

1. every PP rank measures (:func:`measure`) how long its device takes to read
   a decoder layer's weights at a decode batch: the layer's matrices, sized
   from the target's config (at most :data:`MAX_PARAMS` parameters, scaled
   down alike), multiplied by ``min(max_num_seqs, 16) x (k + 1)`` rows, in
   :data:`ROUNDS` rounds of at least :data:`ROUND_S` each (a round spans a
   few scheduler periods, so a host held to part of a core shows it), the
   median round kept; and its memory free for weights;
2. ``all_gather_object`` of these figures on the PP group's ``cpu_group``
   (every PP rank, once);
3. the first PP rank chooses the split (``layer_split.choose_measured``; where
   the speeds are within its noise margin, as if equal: the work and the
   measured memory decide) and
   ``broadcast_object_list`` sends it from there (every PP rank, once, right
   after the gather): every rank holds the same split, decided once;
4. every rank sets ``VLLM_PP_LAYER_PARTITION`` and logs the figures and the split.

Both collectives run on every PP rank whenever the rule is ``measured`` and
the variable unset: the start-up check before them refuses ranks that differ
in either.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import torch

from vllm_ppspec.choice import layer_split
from vllm_ppspec.choice.layer_split import StageFigures
from vllm_ppspec.choice.stage_work import estimate, layer_sizes
from vllm_ppspec.protocol.agreement import host_label

MAX_PARAMS = 32 * 1024 * 1024  # the benchmark's weights, at most
ROUNDS = 5
ROUND_S = 0.2
BATCH_ROWS = 16  # requests of the decode batch, at most (times k + 1 rows)
WEIGHTS_SHARE = 0.8  # of the memory free for vLLM, for a stage's weights


def _matrices(config: Any, params: int) -> list[tuple[int, int]]:
    """(rows, cols) of one decoder layer's weight matrices, scaled to ``params`` at most."""
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    inner = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    shapes = [
        (hidden, (heads + 2 * kv) * head_dim),
        (heads * head_dim, hidden),
        (hidden, 2 * inner),
        (inner, hidden),
    ]
    total = sum(r * c for r, c in shapes)
    scale = min(1.0, params / total)
    return [(r, max(1, int(c * scale))) for r, c in shapes]


def device_rate(vllm_config: Any, device: torch.device) -> float:
    """Seconds per parameter read: the median of :data:`ROUNDS` timed rounds."""
    config = vllm_config.model_config.hf_text_config
    dtype = vllm_config.model_config.dtype
    k = int(getattr(vllm_config.speculative_config, "num_speculative_tokens", 0) or 0)
    rows = min(int(vllm_config.scheduler_config.max_num_seqs), BATCH_ROWS) * (k + 1)
    gen = torch.Generator(device="cpu").manual_seed(0)
    pairs = []
    for r, c in _matrices(config, MAX_PARAMS):
        w = torch.randn(r, c, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        x = torch.randn(rows, r, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        pairs.append((x, w))
    params = sum(w.numel() for _, w in pairs)

    def once() -> None:
        for x, w in pairs:
            torch.matmul(x, w)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    once()  # warm-up
    rates = []
    for _ in range(ROUNDS):
        start, n = time.perf_counter(), 0
        while (elapsed := time.perf_counter() - start) < ROUND_S or n == 0:
            once()
            n += 1
        rates.append(elapsed / (n * params))
    return statistics.median(rates)


def capacity(vllm_config: Any, device: torch.device) -> float:
    """Bytes for weights: :data:`WEIGHTS_SHARE` of the memory free for vLLM (on
    CUDA what ``gpu_memory_utilization`` leaves of the free memory; on CPU the
    available memory less vLLM's KV cache space); the rest is for the KV
    cache and the activations."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        util = float(vllm_config.cache_config.gpu_memory_utilization)
        return WEIGHTS_SHARE * float(free - (1.0 - util) * total)
    import psutil

    kv = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 0) * 2**30
    return WEIGHTS_SHARE * (float(psutil.virtual_memory().available) - kv)


def measure(vllm_config: Any, device: torch.device) -> StageFigures:
    return StageFigures(
        device_rate(vllm_config, device), capacity(vllm_config, device), host_label()
    )


def applies(vllm_config: Any) -> bool:
    """The measured rule is in force here: every PP rank then runs :func:`settle`."""
    from vllm_ppspec.choice.plan import plan_of

    return plan_of(vllm_config).split_rule == "measured" and layer_split.user_split() is None


def settle(vllm_config: Any, pp: Any, device: torch.device) -> str | None:
    """Steps 1-4 of the module docstring, on every PP rank (``pp``: vLLM's PP
    group). Returns the split set (None: vLLM's even split)."""
    import torch.distributed as dist

    started = time.perf_counter()
    try:
        mine: StageFigures | str = measure(vllm_config, device)
    except Exception as e:  # gathered all the same: no rank is left waiting
        mine = f"{type(e).__name__}: {e}"
    figures: list[Any] = [None] * pp.world_size
    dist.all_gather_object(figures, mine, group=pp.cpu_group)
    decided: list[Any] = [None]
    if pp.rank_in_group == 0:
        decided = [decide(vllm_config, figures)]
    dist.broadcast_object_list(decided, src=pp.ranks[0], group=pp.cpu_group)
    split, even, by_weights = decided[0]
    value = layer_split.set_split(split)
    layer_split.logger.info(
        "vllm-ppspec: target layers split %s (measured; vLLM's even split %s, the weights "
        "rule's %s): %s; measured in %.1f s",
        value or ",".join(map(str, even)),
        ",".join(map(str, even)),
        ",".join(map(str, by_weights)),
        "; ".join(describe(vllm_config, i, f) for i, f in enumerate(figures)),
        time.perf_counter() - started,
    )
    return value


def describe(vllm_config: Any, stage: int, f: StageFigures | str) -> str:
    if not isinstance(f, StageFigures):
        return f"stage {stage} could not measure ({f}): the weights rule's split"
    sizes = layer_sizes(vllm_config.model_config.hf_text_config)
    per_layer = f.seconds_per_param * (sizes[0] if sizes else 0) * 1e3
    free = "unknown" if f.capacity_bytes == float("inf") else f"{f.capacity_bytes / 2**30:.1f} GiB"
    return f"stage {stage} on {f.host}: {per_layer:.2f} ms per layer, {free} free for weights"


def decide(
    vllm_config: Any, figures: list[StageFigures | str]
) -> tuple[list[int] | None, list[int], list[int]]:
    """(the split, vLLM's even split, the weights rule's split); the split None
    where the target has no estimate or no split fits (vLLM's even split), the
    weights rule's where a stage could not measure."""
    pp = len(figures)
    layers = int(vllm_config.model_config.get_total_num_hidden_layers())
    even = layer_split.even_split(layers, pp)
    stages = estimate(vllm_config)
    if stages is None:
        return None, even, even
    by_weights = layer_split.choose(layers, pp, stages, even)
    measured = [f for f in figures if isinstance(f, StageFigures)]
    if len(measured) < pp:
        return by_weights, even, by_weights
    if layer_split.same_speed(measured):  # within the noise: equal speeds, measured memory
        measured = [StageFigures(1.0, f.capacity_bytes, f.host) for f in measured]
    bytes_per_param = torch.tensor([], dtype=vllm_config.model_config.dtype).element_size()
    split = layer_split.choose_measured(layers, stages, even, measured, bytes_per_param)
    return split, even, by_weights
