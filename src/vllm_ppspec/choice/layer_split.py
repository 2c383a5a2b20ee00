"""The target's layer split between PP stages, by one of three rules.

Besides its share of the target's layers, the last PP stage runs the target's
LM head over every verified position (k + 1 per request) and the drafter (or
the first stage runs the drafter: runner/drafter/first_stage.py); and the
stages' hosts may differ in speed and memory. vLLM splits the layers evenly
(``vllm.distributed.utils.get_pp_indices``). On the lines the plugin serves at
PP > 1, where ``VLLM_PP_LAYER_PARTITION`` is not set, the plugin sets that
variable (vLLM's own knob, read when the model is built) by the rule
``VLLM_PPSPEC_LAYER_SPLIT`` names (:data:`RULES`):

* ``even``: vLLM's split;
* ``weights`` (the default): the split whose stages' estimated work per step
  (:mod:`.stage_work`: parameters read) is most equal, among those whose
  heaviest stage holds no more weights than vLLM's even split's heaviest, so a
  model that fits evenly still fits (:func:`choose`). Every rank computes it
  from the same configs, before vLLM builds anything (:func:`apply`);
* ``measured``: each stage measures its speed and free memory at set-up
  (``runner/stage_speed.py``), the ranks exchange the figures, the first rank
  chooses the split whose slowest stage takes least time per step within
  each stage's memory (:func:`choose_measured`) and every rank takes it.

The user's ``VLLM_PP_LAYER_PARTITION`` always wins; the start-up check compares
it and the rule across the ranks (``runner/health/startup_check.py``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from vllm_ppspec.choice.policy import SPLIT_ENV, SPLIT_RULE_ENV
from vllm_ppspec.choice.stage_work import Stages, drafter_on_first_stage, estimate

# Under vLLM's "vllm" logger, whose handler prints INFO lines in every process
# (a logger outside it prints only warnings: the chosen split would go unseen).
logger = logging.getLogger("vllm.ppspec")

# Measured speeds closer than this count as equal (the measurement's noise
# between start-ups, docs/measurements.md): the weights rule's split stands.
SAME_SPEED = 0.10

# The value this process set, so that a later config of the same process (an
# external launcher, a second vllm.LLM) recomputes it instead of taking it for
# the user's.
_set_here: str | None = None


@dataclass(frozen=True)
class StageFigures:
    """What one stage measured at set-up (``runner/stage_speed.py``)."""

    seconds_per_param: float  # a decoder layer's weights read at a decode batch, per parameter
    capacity_bytes: float  # free memory for weights (inf: not known)
    host: str


def even_split(num_layers: int, pp: int) -> list[int]:
    """vLLM's split with ``VLLM_PP_LAYER_PARTITION`` unset, from vLLM's own
    ``get_pp_indices`` (the variable must be unset while this runs)."""
    from vllm.distributed.utils import get_pp_indices

    return [end - start for start, end in (get_pp_indices(num_layers, r, pp) for r in range(pp))]


def spread(layers: int, stages: int) -> list[int]:
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
        + [spread(num_layers - last, pp - 1) + [last] for last in ends]
        + [[first] + spread(num_layers - first, pp - 1) for first in ends]
    )
    allowed = [s for s in candidates if weights(s) <= limit]
    return min(allowed, key=lambda s: (work(s), distance(s)))


def choose_measured(
    num_layers: int,
    stages: Stages,
    even: list[int],
    figures: list[StageFigures],
    bytes_per_param: float,
) -> list[int] | None:
    """The split whose slowest stage takes least time per step (its work, per
    :mod:`.stage_work`, times its measured seconds per parameter), among those
    whose every stage's weights fit its memory; ties go to the split nearest
    ``even``. None if no split fits. Exact over every split (dynamic programming
    over stages and layers)."""
    pp = len(figures)
    fastest = min(f.seconds_per_param for f in figures)
    pace = [f.seconds_per_param / fastest for f in figures]

    def cost(i: int, n: int) -> float:
        if n < 1:
            return float("inf")
        work = n * stages.layer_work + (stages.first_work if i == 0 else 0.0)
        held = n * stages.layer_weights + (stages.first_weights if i == 0 else 0.0)
        if i == pp - 1:
            work += stages.last_work
            held += stages.last_weights
        if held * bytes_per_param > figures[i].capacity_bytes:
            return float("inf")
        return work * pace[i]

    def best(bound: float) -> list[int] | None:
        """The split nearest ``even`` whose every stage costs at most ``bound``."""
        inf: tuple[float, list[int]] = (float("inf"), [])
        # reach[l]: (distance, split) of the first stages holding l layers.
        reach: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}
        for i in range(pp):
            nxt: dict[int, tuple[float, list[int]]] = {}
            for held, (dist, split) in reach.items():
                for n in range(1, num_layers - held - (pp - 1 - i) + 1):
                    if cost(i, n) > bound:
                        continue
                    cand = (dist + abs(n - even[i]), split + [n])
                    if cand[0] < nxt.get(held + n, inf)[0]:
                        nxt[held + n] = cand
            reach = nxt
        return reach[num_layers][1] if num_layers in reach else None

    # The least bottleneck some split reaches: a split that fits a bound fits
    # every larger one, so a binary search over the stages' possible costs.
    bounds = sorted(
        {c for i in range(pp) for n in range(1, num_layers + 1) if (c := cost(i, n)) < float("inf")}
    )
    lo, hi, found = 0, len(bounds) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        split = best(bounds[mid] * (1 + 1e-9))
        if split is None:
            lo = mid + 1
        else:
            found, hi = split, mid - 1
    return found


def same_speed(figures: list[StageFigures]) -> bool:
    speeds = [f.seconds_per_param for f in figures]
    return max(speeds) <= min(speeds) * (1 + SAME_SPEED)


def set_split(split: list[int] | None) -> str | None:
    """Put ``split`` in ``VLLM_PP_LAYER_PARTITION`` for this process (None: vLLM's)."""
    global _set_here
    os.environ.pop(SPLIT_ENV, None)
    _set_here = None if split is None else ",".join(str(n) for n in split)
    if _set_here is not None:
        os.environ[SPLIT_ENV] = _set_here
    return _set_here


def user_split() -> str | None:
    """The user's ``VLLM_PP_LAYER_PARTITION``, or None (unset, or set by this process)."""
    current = os.environ.get(SPLIT_ENV)
    return current if current is not None and current != _set_here else None


def split_for(vllm_config: Any, weight_limit: bool = True) -> tuple[list[int], list[int]] | None:
    """(the weights rule's split, vLLM's even split) for this config, or None
    where the plugin keeps vLLM's. ``VLLM_PP_LAYER_PARTITION`` must be unset."""
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
        f"vLLM's even split puts on any: set {SPLIT_ENV}={value} where that fits"
    )


def apply(vllm_config: Any) -> str | None:
    """In the plugin's worker, before vLLM builds the runner and the model: on a
    line the plugin serves at PP > 1, set ``VLLM_PP_LAYER_PARTITION`` by the
    weights rule, unless the user set it (the measured rule sets it later, at
    the runner's set-up). Returns the split in force (None: vLLM's even split,
    not such a line, or the measured rule's, to come)."""
    from vllm_ppspec.choice.plan import plan_of

    plan = plan_of(vllm_config)
    if not plan.serves_pp:
        return None
    current = user_split()
    if current is not None:
        logger.info("vllm-ppspec: target layers split %s (%s, as set)", current, SPLIT_ENV)
        return current
    how = plan.split_rule
    set_split(None)
    chosen = split_for(vllm_config) if how == "weights" else None
    if how == "measured":
        return None
    if chosen is None or chosen[0] == chosen[1]:
        logger.info(
            "vllm-ppspec: target layers split evenly (vLLM's split%s)%s",
            "" if how == "weights" else f", {SPLIT_RULE_ENV}=even",
            _hint(vllm_config, None) if chosen else "",
        )
        return None
    split, even = chosen
    value = set_split(split)
    logger.info(
        "vllm-ppspec: target layers split %s over %d PP stages instead of vLLM's %s: the "
        "last stage also runs the LM head over k+1 positions, and the %s drafter runs on "
        "the %s stage; set %s to choose the split%s",
        value,
        len(split),
        ",".join(str(n) for n in even),
        vllm_config.speculative_config.method,
        "first" if drafter_on_first_stage(vllm_config) else "last",
        SPLIT_ENV,
        _hint(vllm_config, split),
    )
    return value
