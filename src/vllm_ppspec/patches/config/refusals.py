"""Name the combinations the plugin's worker does not run, on the lines it serves.

vLLM's ``_get_v1_model_runner_unsupported_features`` (wrapped in
``patches/config/__init__.py``) adds these reasons where the plugin acts
(``Plan.acts``: its worker selected, on speculative decoding with
PP > 1 or with DP > 1 on a MoE model), so vLLM raises its usual
``ValueError`` naming them. Elsewhere nothing is added: the plugin's worker,
if named, runs as vLLM's own V1 worker.
"""

from __future__ import annotations

from typing import Any

from vllm_ppspec.choice.plan import plan_of
from vllm_ppspec.choice.unserved import why_unserved
from vllm_ppspec.choice.worker import SUPPORTED_PP_METHODS


def pp_spec_unsupported(vllm_config: Any) -> list[str]:
    """Reasons the plugin's worker cannot run this config, where it acts."""
    if not plan_of(vllm_config).acts:
        return []
    spec = vllm_config.speculative_config
    pp = vllm_config.parallel_config.pipeline_parallel_size
    reasons = []
    if spec.method not in SUPPORTED_PP_METHODS:
        reasons.append(
            f"speculative method {spec.method!r} with pipeline parallelism, or data "
            f"parallelism on a MoE model, under vllm-ppspec: {why_unserved(spec.method)}"
        )
    if pp <= 1:
        return reasons
    model_config = vllm_config.model_config
    if (
        model_config is not None
        and model_config.is_hybrid
        and vllm_config.cache_config.enable_prefix_caching
        and _on_cpu()
    ):
        reasons.append(
            "prefix caching with a hybrid (GDN/Mamba) model and speculative decoding on "
            "the CPU backend (its 'align' state copy needs Triton; pass "
            "--no-enable-prefix-caching)"
        )
    if legacy_ray_async(vllm_config):
        reasons.append(
            "async scheduling with vLLM's legacy Ray executor under vllm-ppspec (it calls "
            "sample_tokens on the last PP rank only, which both async modes need on every "
            "rank): unset VLLM_USE_RAY_V2_EXECUTOR_BACKEND (vLLM's default RayExecutorV2 "
            "runs it), drop --async-scheduling, or use --distributed-executor-backend mp"
        )
    if (
        vllm_config.parallel_config.distributed_executor_backend == "external_launcher"
        and vllm_config.scheduler_config.async_scheduling
    ):
        reasons.append(
            "async scheduling with the external_launcher PP mode under vllm-ppspec (each "
            "rank's engine takes the last rank's tokens once per step): drop "
            "--async-scheduling"
        )
    return reasons


def legacy_ray_async(vllm_config: Any) -> bool:
    """Async scheduling on vLLM's legacy ``RayDistributedExecutor``
    (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``). vLLM's default Ray executor,
    ``RayExecutorV2``, subclasses the mp executor and runs the plugin's worker
    like it; the legacy one drives the runner itself and samples on the last
    rank only, so the other ranks never post or receive a round. vLLM 0.33
    removed the legacy one."""
    import vllm.envs as envs

    backend = vllm_config.parallel_config.distributed_executor_backend
    # vLLM 0.33 has RayExecutorV2 only (no such switch): never the legacy one.
    v2 = getattr(envs, "VLLM_USE_RAY_V2_EXECUTOR_BACKEND", True)
    return backend == "ray" and bool(vllm_config.scheduler_config.async_scheduling) and not v2


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
