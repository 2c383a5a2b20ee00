"""A stop of a pipeline across hosts at vLLM's default ``--shutdown-timeout 0``.

On SIGTERM, ``vllm serve`` SIGTERMs its engine core, then SIGKILLs the engine
core's process tree after the window ``get_engine_process_shutdown_timeout``
returns (``vllm/v1/engine/utils.py``; ``vllm/v1/utils.py:shutdown``). With
``--shutdown-timeout 0`` (abort) that window is 0 except on ROCm (vLLM 0.33:
or where ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` is set), so the workers are
killed before vLLM's executor stops them and they cannot say goodbye to their
PP peers (``runner/health/orderly_stop.py``). On one host every worker dies together;
across hosts the other node cannot tell the kill from a crash and reports a
dead peer.

Where the plugin serves a pipeline whose ranks sit on several nodes
(mp executor, :func:`pipeline_crosses_hosts`), the wrapper gives the engine
core the window vLLM gives a stop with no timeout,
``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` (5 s), as vLLM does for ROCm:
requests are still aborted at once (the engine core's own mode is unchanged),
the engine core stops its executor in order, and the process manager waits
only until it has exited. Everywhere else vLLM's value stands.
"""

from __future__ import annotations

import functools
from typing import Any

# Some config built in this process runs the plugin's worker across nodes.
across_nodes = False


def note_config(vllm_config: Any, plugin_acts: bool) -> None:
    """Record a config built in this process (from ``VllmConfig.__post_init__``);
    ``plugin_acts``: its plan's (``choice.plan.Plan.acts``)."""
    global across_nodes
    parallel = vllm_config.parallel_config
    if (
        plugin_acts
        and parallel.distributed_executor_backend == "mp"
        and pipeline_crosses_hosts(parallel)
    ):
        across_nodes = True


def pipeline_crosses_hosts(parallel: Any) -> bool:
    """Whether one pipeline's ranks sit on more than one node: PP > 1 and a DP
    replica spanning nodes (``--nnodes`` > 1 with each DP replica on its own
    node keeps every pipeline on one host)."""
    if parallel.pipeline_parallel_size <= 1 or parallel.nnodes <= 1:
        return False
    try:
        return int(parallel.nnodes_within_dp) > 1
    except ValueError:  # nnodes not divisible by the DP node groups: vLLM refuses it
        return False


def window(request_timeout: float | None, process_timeout: float | None, vllm_value: Any) -> Any:
    """The process manager's window: vLLM's, or the grace where the plugin needs one."""
    if not across_nodes or request_timeout != 0 or process_timeout != 0:
        return vllm_value
    if vllm_value != process_timeout:
        return vllm_value  # vLLM gave a window of its own (ROCm; 0.33's variable)
    import vllm.envs as envs

    return float(envs.VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS)


def _wrap(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(request_timeout: float | None, process_timeout: float | None) -> Any:
        value = original(request_timeout, process_timeout)
        return window(request_timeout, process_timeout, value)

    return wrapper


def install() -> None:
    """Wrap ``get_engine_process_shutdown_timeout`` (the ``config`` group; once)."""
    import vllm.v1.engine.utils as engine_utils

    from vllm_ppspec.patches.config import installed

    if installed():
        return
    engine_utils.get_engine_process_shutdown_timeout = _wrap(  # type: ignore[assignment]
        engine_utils.get_engine_process_shutdown_timeout
    )
