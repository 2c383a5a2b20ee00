"""Every rank of a deployment serves the same way: who serves, compared at start-up.

Each host and each DP replica builds its config from its own command line and
environment, so each decides alone who serves (:mod:`.worker_choice`): a host
with ``VLLM_PPSPEC_AUTO=0`` or ``VLLM_USE_V2_MODEL_RUNNER=1`` would run vLLM's
own worker beside the plugin's. Installed in every vLLM process by the config
patches, this check acts in the workers, whatever their class: right after
vLLM's ``initialize_model_parallel`` built the groups, for speculative decoding
with PP > 1 or DP > 1, every rank of the world group (every PP rank of every
DP replica) calls :func:`vllm_ppspec.protocol.agreement.gather` once, on the
world group's gloo group, with :func:`decision_of`: the worker, the runner, the
plugin's mode and vLLM's release (:data:`DECISION_FIELDS`), and the settings
behind them. Where a decision field differs, every rank raises
:class:`DeploymentMismatchError` naming each field and setting that differs
and its value on each rank; nothing else is compared here (the plugin's
runner compares its own fields later, ``runner/health/startup_check.py``).

The plugin must be installed on every host: a rank without it never reaches
the check, and the others name it after ``VLLM_PPSPEC_STARTUP_TIMEOUT``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from vllm_ppspec.protocol.agreement import (
    TIMEOUT_ENV,
    RankMissingError,
    differences,
    gather,
    timeout_s,
)
from vllm_ppspec.version_guard import installed_vllm_version
from vllm_ppspec.worker_choice import AUTO_ENV, platform_name, spec_in_parallel

DECISION_FIELDS = ("worker", "runner", "mode", "vLLM release")
V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"


class DeploymentMismatchError(RuntimeError):
    """Ranks of one deployment decided differently who serves; raised on every rank."""


def needed(vllm_config: Any) -> bool:
    parallel = vllm_config.parallel_config
    spec = vllm_config.speculative_config
    return spec_in_parallel(
        int(parallel.pipeline_parallel_size),
        int(parallel.data_parallel_size),
        None if spec is None else str(spec.method),
    )


def decision_of(vllm_config: Any, mode: str) -> dict[str, str]:
    """This rank's decision (:data:`DECISION_FIELDS`) and the settings behind it."""
    return {
        "worker": str(vllm_config.parallel_config.worker_cls),
        "runner": "Model Runner V2" if vllm_config.use_v2_model_runner else "V1",
        "mode": mode,
        "vLLM release": installed_vllm_version(),
        f"${AUTO_ENV}": os.environ.get(AUTO_ENV, "<unset>"),
        f"${V2_ENV}": os.environ.get(V2_ENV, "<unset>"),
        "platform": platform_name(),
    }


def verdict(prints: list[dict[str, str]]) -> str | None:
    """The refusal every rank raises for these decisions, or None if they agree."""
    decided = differences([{k: p.get(k, "<unset>") for k in DECISION_FIELDS} for p in prints])
    if not decided:
        return None
    settings = differences(
        [{k: v for k, v in p.items() if k not in DECISION_FIELDS} for p in prints]
    )
    return (
        "vllm-ppspec: the ranks of this deployment decided differently who serves "
        "speculative decoding with PP or DP; start every host and DP replica with the same "
        f"vLLM, ${AUTO_ENV} and ${V2_ENV}. Differs: " + "; ".join(decided + settings)
    )


def check(vllm_config: Any, group: Any, mode: str) -> None:
    """Collective on ``group`` (every rank of it, once): see the module docstring."""
    timeout = timeout_s()
    try:
        prints = gather(group, decision_of(vllm_config, mode), timeout)
    except RankMissingError as e:
        raise DeploymentMismatchError(
            f"vllm-ppspec: a rank did not reach the deployment check within {timeout:.0f} s "
            f"({e}); install vllm-ppspec on every host of the deployment. {TIMEOUT_ENV} "
            "sets the wait."
        ) from e
    refusal = verdict(prints)
    if refusal is not None:
        raise DeploymentMismatchError(refusal)


def _wrap(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        from vllm.config import get_current_vllm_config_or_none
        from vllm.distributed.parallel_state import get_world_group

        from vllm_ppspec.patches.config import plugin_mode

        vllm_config = get_current_vllm_config_or_none()
        world = get_world_group()
        if vllm_config is not None and world.world_size > 1 and needed(vllm_config):
            check(vllm_config, world.cpu_group, plugin_mode(vllm_config).value)
        return result

    return wrapper


def install() -> None:
    """Wrap ``initialize_model_parallel`` (the ``config`` group; once)."""
    import vllm.distributed.parallel_state as parallel_state

    from vllm_ppspec.patches.config import installed

    if installed():
        return
    parallel_state.initialize_model_parallel = _wrap(  # type: ignore[assignment]
        parallel_state.initialize_model_parallel
    )
