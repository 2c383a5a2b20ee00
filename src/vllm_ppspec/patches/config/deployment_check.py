"""Compare every rank's decision at start-up: vLLM's ``initialize_model_parallel`` wrapped.

Installed in every vLLM process by the config patches (the ``config`` group).
Right after vLLM built the groups, in every worker whatever its class, where
the world group has more than one rank and the config's plan checks the
deployment (``Plan.checks_deployment``), it runs
:func:`vllm_ppspec.choice.deployment.check`; elsewhere it adds nothing.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_ppspec.choice import deployment
from vllm_ppspec.choice.plan import plan_of
from vllm_ppspec.protocol import decision_board


def _wrap(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        from vllm.config import get_current_vllm_config_or_none
        from vllm.distributed.parallel_state import get_world_group

        vllm_config = get_current_vllm_config_or_none()
        if vllm_config is None:
            return result
        plan = plan_of(vllm_config)
        world = get_world_group()
        if world.world_size > 1 and plan.checks_deployment:
            board = decision_board.board(decision_board.default_store())
            deployment.check(vllm_config, board, world.rank_in_group, world.world_size, plan)
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
