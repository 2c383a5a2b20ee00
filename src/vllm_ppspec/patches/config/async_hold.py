"""Lift vLLM 0.33's PP + async refusal on the V1 runner, for PP + spec with the plugin's worker.

Only that refusal is lifted.

vLLM 0.33's ``VllmConfig.__post_init__`` raises "Async scheduling is not
supported by the V1 model runner with pipeline parallelism." for an explicit
``--async-scheduling`` at PP > 1, before any hook the plugin has. The same
branch refuses other things the plugin does not change: a speculative method
that V1 cannot run asynchronously (ngram, whose list drafts never reach the
lanes' round), ``disable_padded_drafter_batch``, ROCm DeepEP high-throughput
DBO. :func:`hold_async` therefore hides ``async_scheduling`` from vLLM's
checks only when the PP refusal is the one vLLM would raise; otherwise vLLM
raises its own error as it does without the plugin. vLLM 0.32 refuses PP +
async later (``_get_v1_model_runner_unsupported_features``), so nothing is
held there.

vLLM's V1 check ran while ``async_scheduling`` was held, so the plugin's own
refusals that depend on it (``refusals.pp_spec_unsupported``: async with the
external launcher) are asked again once it is back, in vLLM's words.
"""

from __future__ import annotations

from typing import Any

from vllm_ppspec.patches.config.refusals import pp_spec_unsupported


def refuses_pp_async_in_post_init() -> bool:
    """vLLM 0.33's ``__post_init__`` refuses PP + an explicit --async-scheduling."""
    from vllm_ppspec.compat.guard import vllm_at_least

    return vllm_at_least("0.33.0")


def v1_async_refusal_besides_pp(vllm_config: Any) -> str | None:
    """What vLLM 0.33's explicit-async branch would refuse before (or instead
    of) pipeline parallelism on the V1 runner, or None.

    Mirrors ``vllm.config.vllm:VllmConfig.__post_init__`` (0.33.0: the
    ``uses_rocm_deepep_ht_dbo`` check and the ``v1_async_sched_incompat``
    chain without its last, PP branch); pinned in
    ``compat.data.MIRRORED_FUNCTIONS``.
    """
    from typing import get_args

    from vllm.config.speculative import EagleModelTypes, NgramGPUTypes
    from vllm.platforms import current_platform

    parallel = vllm_config.parallel_config
    if (
        current_platform.is_rocm()
        and parallel.enable_dbo
        and parallel.all2all_backend == "deepep_high_throughput"
    ):
        return "ROCm DeepEP high-throughput DBO"
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    async_methods = (
        *get_args(EagleModelTypes),
        *get_args(NgramGPUTypes),
        "draft_model",
        "dspark",
        "dflash",
    )
    if spec.method not in async_methods:
        return f"{spec.method}-based speculative decoding"
    if spec.disable_padded_drafter_batch:
        return "disable_padded_drafter_batch=True"
    return None


def hold_async(vllm_config: Any, pp_mode_on: bool) -> bool:
    """Before vLLM's ``__post_init__``: hide an explicit ``async_scheduling=True``
    (``False`` is an explicit choice: vLLM neither raises nor logs about it)
    when vLLM 0.33 would refuse it for PP alone, under PP + spec with the
    plugin's worker. Returns whether it held it; :func:`restore_async` puts it
    back. Any other refusal of that branch stays vLLM's."""
    if not (
        pp_mode_on
        and vllm_config.scheduler_config.async_scheduling is True
        and refuses_pp_async_in_post_init()
        and v1_async_refusal_besides_pp(vllm_config) is None
    ):
        return False
    vllm_config.scheduler_config.async_scheduling = False
    return True


def restore_async(vllm_config: Any, dp_sync_unset: bool) -> None:
    """After vLLM's ``__post_init__``: async scheduling back on, with what vLLM's
    explicit-async branch does after its refusals (the executor check, DP
    synchronisation over gloo instead of NCCL when the user left it unset),
    then the plugin's refusals that depend on async scheduling."""
    from vllm.v1.executor.abstract import Executor

    if not Executor.get_class(vllm_config).supports_async_scheduling():
        backend = vllm_config.parallel_config.distributed_executor_backend
        raise ValueError(f"`{backend}` does not support async scheduling yet.")
    vllm_config.scheduler_config.async_scheduling = True
    if dp_sync_unset:
        vllm_config.parallel_config.disable_nccl_for_dp_synchronization = True
    reasons = pp_spec_unsupported(vllm_config)
    if reasons:
        raise ValueError(f"Model Runner V1 does not support: {', '.join(reasons)}")
