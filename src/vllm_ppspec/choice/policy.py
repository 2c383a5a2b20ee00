"""Decide the mode of PP + speculative decoding once, from config and env.

Pure functions of a few config facts and the environment: no vLLM import.
Both sides call them: the engine-side config patch (batches in flight, which
scheduler) and the runner (which steps object); the start-up check compares
the runner's mode across PP ranks (``runner/health/startup_check.py``).

* ``OFF``: the plugin does not act on this line (``choice.worker.acts``), or
  it does at PP = 1 (DP > 1 on a MoE target). Nothing of the plugin runs per step.
* ``SYNC``: sync scheduling. The plugin's scheduler keeps PP batches in flight
  (one per stage; :data:`ONE_BATCH_ENV` = 1 keeps one); the scheduler output
  carries every token a rank needs: no per-round exchange.
* ``LANES``: async scheduling. Requests are pinned to lanes, PP + 1 batches in
  flight; the last rank sends each round to the others, one way.
* ``EXTERNAL``: the external launcher (torchrun: one engine per rank, vLLM's
  own scheduler, one batch); the last rank broadcasts each step's sampled
  tokens and drafts to the others (``runner/steps/external.py``).
"""

from __future__ import annotations

import enum
import os

# Sync scheduling: one batch in flight instead of PP. For a model drafter at
# moderate load (docs/measurements.md, "One batch or PP batches").
ONE_BATCH_ENV = "VLLM_PPSPEC_ONE_BATCH"

# Where a draft model runs under sync scheduling: "last" (vLLM's place),
# "first" (runner/drafter/first_stage.py) or "auto", the default (the first
# where the stage-cost model says it balances the stages, on CPU:
# choice/drafter_stage.py).
DRAFTER_STAGE_ENV = "VLLM_PPSPEC_DRAFTER_STAGE"
DRAFTER_STAGES = ("first", "last", "auto")
DEFAULT_DRAFTER_STAGE = "auto"

# Adaptive K (adaptive_k/): the plugin's schedulers choose K by batch size.
ADAPTIVE_K_ENV = "VLLM_PPSPEC_ADAPTIVE_K"

# The layer split's rule (choice/layer_split.py).
SPLIT_RULE_ENV = "VLLM_PPSPEC_LAYER_SPLIT"
SPLIT_RULES = ("even", "weights", "measured")
DEFAULT_SPLIT_RULE = "weights"
# The split itself, as the user sets it (vLLM's own knob): wins over every rule.
SPLIT_ENV = "VLLM_PP_LAYER_PARTITION"

SCHEDULER_QUALNAME = "vllm_ppspec.sched.filled.PPSpecScheduler"
LANE_SCHEDULER_QUALNAME = "vllm_ppspec.sched.lanes.PPSpecLaneScheduler"


class Mode(enum.Enum):
    OFF = "off"
    SYNC = "sync"
    LANES = "async with lanes"
    EXTERNAL = "external launcher"


def mode_of(
    acts: bool, pp_size: int, async_scheduling: bool, external_launcher: bool = False
) -> Mode:
    """The mode of a line; ``acts``: the plugin acts on it (``choice.worker.acts``);
    ``external_launcher``: ``--distributed-executor-backend external_launcher``."""
    if not acts or pp_size <= 1:
        return Mode.OFF
    if external_launcher:
        return Mode.EXTERNAL
    return Mode.LANES if async_scheduling else Mode.SYNC


def one_batch() -> bool:
    return os.environ.get(ONE_BATCH_ENV) == "1"


def batches_in_flight(mode: Mode, pp_size: int, one: bool) -> int:
    """Batches the engine keeps in flight in ``mode`` (not OFF); ``one``:
    :func:`one_batch` as the plan read it."""
    if mode is Mode.LANES:
        return pp_size + 1
    if mode is Mode.EXTERNAL:
        return 1
    return 1 if one else pp_size


def adaptive_k() -> bool:
    """``VLLM_PPSPEC_ADAPTIVE_K=1``."""
    return os.environ.get(ADAPTIVE_K_ENV) == "1"


def split_rule() -> str:
    """``VLLM_PPSPEC_LAYER_SPLIT`` as the plugin reads it (ValueError naming the values)."""
    value = os.environ.get(SPLIT_RULE_ENV, DEFAULT_SPLIT_RULE).strip().lower()
    value = value or DEFAULT_SPLIT_RULE
    if value not in SPLIT_RULES:
        raise ValueError(
            f"vllm-ppspec: {SPLIT_RULE_ENV}={value!r} is not a rule it knows: use one of "
            f"{', '.join(SPLIT_RULES)} (or set {SPLIT_ENV} to choose the split yourself)"
        )
    return value


def scheduler_of(mode: Mode) -> str | None:
    """The plugin scheduler's qualified name for ``mode``, or None for vLLM's own."""
    return {Mode.SYNC: SCHEDULER_QUALNAME, Mode.LANES: LANE_SCHEDULER_QUALNAME}.get(mode)


def scheduler_serves(cls: object, mode: Mode) -> bool:
    """Whether scheduler class ``cls`` is the plugin's for ``mode`` (or a
    subclass): the plugin's schedulers name their mode in ``ppspec_mode``."""
    return isinstance(cls, type) and getattr(cls, "ppspec_mode", None) is mode


# Why the drafter stays on the last stage where the user asked for it there.
STAGE_NOT_ASKED = f"{DRAFTER_STAGE_ENV}=last"
# Why it runs on the first where the user asked for it there.
STAGE_ASKED_FIRST = f"{DRAFTER_STAGE_ENV}=first"


def drafter_stage() -> str:
    """``VLLM_PPSPEC_DRAFTER_STAGE`` as the plugin reads it (ValueError naming the values)."""
    wanted = os.environ.get(DRAFTER_STAGE_ENV, "").strip().lower() or DEFAULT_DRAFTER_STAGE
    if wanted not in DRAFTER_STAGES:
        raise ValueError(
            f"{DRAFTER_STAGE_ENV}={wanted!r}: expected one of {', '.join(DRAFTER_STAGES)}"
        )
    return wanted


def drafter_placement(
    spec_method: str, parallel_drafting: bool, sync: bool, dp_size: int
) -> str | None:
    """Why the drafter stays on the last stage, or None if it may run on the first
    (``VLLM_PPSPEC_DRAFTER_STAGE`` first or auto (the default), a draft model
    drafting one token a pass, sync scheduling, DP = 1; under auto the plan
    asks the stage-cost model next)."""
    wanted = drafter_stage()
    if wanted == "last":
        return STAGE_NOT_ASKED
    if spec_method != "draft_model" or parallel_drafting:
        return "only a draft model drafting one token a pass runs on the first stage"
    if not sync:
        return "async scheduling (or the external launcher) keeps the drafter on the last stage"
    if dp_size > 1:
        return "data parallelism keeps the drafter on the last stage"
    return None


def drafter_placement_of(vllm_config: object) -> str | None:
    """:func:`drafter_placement` of a ``VllmConfig``: one reading for the layer split
    (``layer_split.py``) and the runner (``runner/drafter/first_stage.py``). Sync
    means the plugin's ``SYNC`` mode: no async scheduling, no external launcher."""
    spec = getattr(vllm_config, "speculative_config", None)
    scheduler = getattr(vllm_config, "scheduler_config", None)
    parallel = getattr(vllm_config, "parallel_config", None)
    external = getattr(parallel, "distributed_executor_backend", None) == "external_launcher"
    return drafter_placement(
        str(getattr(spec, "method", None)),
        bool(getattr(spec, "parallel_drafting", False)),
        not getattr(scheduler, "async_scheduling", False) and not external,
        int(getattr(parallel, "data_parallel_size", 1)),
    )
