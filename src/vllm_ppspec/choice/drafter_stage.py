"""Where a draft model runs under ``VLLM_PPSPEC_DRAFTER_STAGE=auto`` (the default): the
stage that balances.

vLLM runs the drafter on the last stage, beside the target's last layers and
its LM head over k + 1 positions per request. A draft model needs only token
ids, so under sync scheduling it can run on the first stage instead
(runner/drafter/first_stage.py). ``auto`` puts it there where the stage-cost
model (:mod:`.stage_work`: weights read per step) says the busiest stage does
less work: each placement's best split by the weights rule
(:func:`.layer_split.choose`, within the same weight limit) is compared, and
the first stage is taken where its busiest stage is at least :data:`GAIN`
lighter. Where the estimate has no figures (hybrid, multimodal, sizes missing)
the drafter stays last. So it does on any device but the CPU
(:data:`TESTED_DEVICES`): the first-stage drafter builds its attention
metadata itself, and only the CPU backend runs it here (docs/support.md);
``VLLM_PPSPEC_DRAFTER_STAGE=first`` asks for it elsewhere. Pure arithmetic on
the configs' sizes; the plan (:mod:`.plan`) calls it once, where the drafter
could move at all.
"""

from __future__ import annotations

from typing import Any

from vllm_ppspec.choice.layer_split import choose, spread
from vllm_ppspec.choice.stage_work import Stages, estimate

# The share of the busiest stage's work the first stage must save: below it the
# two placements are within the estimate's error, and vLLM's stays.
GAIN = 0.05
# The devices whose attention backends run the first-stage drafter in this
# project's tests (vLLM's ``DeviceConfig.device_type``).
TESTED_DEVICES = ("cpu",)


def busiest(layers: int, pp: int, stages: Stages) -> float:
    """The busiest stage's work under the weights rule's split for ``stages``."""
    split = choose(layers, pp, stages, spread(layers, pp))
    loads = [n * stages.layer_work for n in split]
    loads[0] += stages.first_work
    loads[-1] += stages.last_work
    return max(loads)


def auto(vllm_config: Any) -> tuple[bool, str]:
    """(the draft model runs on the first stage, why) under ``auto`` (the module
    docstring)."""
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None)
    if device not in TESTED_DEVICES:
        return False, (
            f"auto: the first-stage drafter is tested on {', '.join(TESTED_DEVICES)} only, "
            f"not on {device}; VLLM_PPSPEC_DRAFTER_STAGE=first asks for it"
        )
    first, last = estimate(vllm_config, first=True), estimate(vllm_config, first=False)
    if first is None or last is None:
        return False, "auto: no estimate of the stages' work for this model"
    pp = int(vllm_config.parallel_config.pipeline_parallel_size)
    layers = int(vllm_config.model_config.get_total_num_hidden_layers())
    on_first, on_last = busiest(layers, pp, first), busiest(layers, pp, last)
    ratio = (
        f"on the first stage the busiest stage reads {on_first / on_last:.2f}x the weights "
        f"it reads with the drafter last (it moves below {1 - GAIN:.2f}x)"
    )
    return on_first <= on_last * (1 - GAIN), f"auto: {ratio}"
