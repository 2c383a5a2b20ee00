"""Config checks that change when, and only when, the plugin worker is selected.

Installed by :func:`vllm_ppspec.plugin.register` in every vLLM process. Each
patch wraps one vLLM function and calls it unchanged unless
``parallel_config.worker_cls`` names a vllm-ppspec worker (which it does by
itself under PP + spec when left at ``auto``, see ``__post_init__``):

* ``VllmConfig._get_v1_model_runner_unsupported_features``: under PP +
  speculative decoding, drops "pipeline parallelism with async scheduling"
  (the plugin runs that combination, see below) and adds the PP + speculative
  combinations the plugin does not support, so vLLM raises its usual
  ``ValueError`` naming them. Without speculative decoding vLLM's refusal
  stays: vLLM refuses PP + async scheduling on the V1 runner because
  structured outputs desync the grammar FSM there (vLLM issue #45014, the
  note in that function), and the plugin changes nothing on that path.
* ``VllmConfig.use_v2_model_runner``: False (the plugin extends the V1 runner);
  an explicit ``VLLM_USE_V2_MODEL_RUNNER=1`` is refused with a ValueError.
* ``CpuPlatform.check_and_update_config``: keeps an explicit
  ``--async-scheduling`` (the CPU platform turns it off unconditionally).
* ``VllmConfig.max_concurrent_batches`` (PP + speculative decoding only):
  under sync scheduling one batch per PP stage, as vLLM does without
  speculation (1 with ``VLLM_PPSPEC_ONE_BATCH=1``, kept for comparison);
  under async scheduling PP + 1, one lane of requests per stage plus the
  next batch of the lane whose round is on its way (2 with
  ``VLLM_PPSPEC_ASYNC_LANES=0``, the earlier mode: vLLM's async spec-decode
  correction then assumes the scheduler lags the worker by exactly one step).
* ``VllmConfig.__post_init__`` (PP + spec): first, with ``--worker-cls auto``
  (vLLM's default), selects the plugin's worker (:func:`select_worker`;
  ``VLLM_PPSPEC_AUTO=0`` keeps vLLM's own). Then selects the plugin's scheduler,
  :class:`vllm_ppspec.sched.filled.PPSpecScheduler` under sync scheduling (it
  applies each batch's drafts when that batch's output is processed) and
  :class:`vllm_ppspec.sched.lanes.PPSpecLaneScheduler` under async
  scheduling (requests pinned to lanes); an explicit other ``--scheduler-cls``
  is refused. Where lanes are off it warns once that the stages take turns
  (:data:`ASYNC_NOTICE`). On vLLM 0.33, which refuses an explicit
  ``--async-scheduling`` with PP on the V1 runner inside ``__post_init__``
  itself, it lifts that refusal for PP + spec only (:func:`hold_async`).
* ``EngineCore.post_step``: skipped with that scheduler. It would fetch the
  latest drafts with a blocking call that waits for the batch to leave the
  pipeline; the drafts come with the batch's output instead
  (:mod:`vllm_ppspec.sched.draft_delivery`).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from vllm_ppspec import WORKER_QUALNAME

# Methods the plugin runs under PP, with the scheduling modes vLLM allows them.
SUPPORTED_PP_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")

PP_ASYNC_REFUSAL = "pipeline parallelism with async scheduling"

# Set to 1 to keep one batch in flight under PP + spec with sync scheduling
# (the plugin's earlier behaviour; the benchmark compares against it).
ONE_BATCH_ENV = "VLLM_PPSPEC_ONE_BATCH"
# Set to 0 to keep two batches in flight under PP + spec with async scheduling,
# the stages taking turns (the plugin's earlier behaviour; for comparison).
LANES_ENV = "VLLM_PPSPEC_ASYNC_LANES"
# Set to 0 to keep vLLM's own worker when --worker-cls is left at "auto".
AUTO_ENV = "VLLM_PPSPEC_AUTO"
SCHEDULER_QUALNAME = "vllm_ppspec.sched.filled.PPSpecScheduler"
LANE_SCHEDULER_QUALNAME = "vllm_ppspec.sched.lanes.PPSpecLaneScheduler"

_PATCHED_FLAG = "_vllm_ppspec_patched"


def plugin_worker_selected(vllm_config: Any) -> bool:
    worker_cls = getattr(vllm_config.parallel_config, "worker_cls", None)
    return isinstance(worker_cls, str) and worker_cls.startswith("vllm_ppspec.")


def pp_spec_unsupported(vllm_config: Any) -> list[str]:
    """Reasons this PP + speculative config cannot run with the plugin worker."""
    spec = vllm_config.speculative_config
    pp = vllm_config.parallel_config.pipeline_parallel_size
    if spec is None or pp <= 1:
        return []
    reasons = []
    if spec.method not in SUPPORTED_PP_METHODS:
        reasons.append(
            f"speculative method {spec.method!r} with pipeline parallelism under "
            f"vllm-ppspec (supported: {', '.join(SUPPORTED_PP_METHODS)})"
        )
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
    if vllm_config.parallel_config.distributed_executor_backend == "external_launcher":
        reasons.append(
            "speculative decoding with the external_launcher PP mode under vllm-ppspec "
            "(use --distributed-executor-backend mp)"
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


def _wrap_unsupported_features(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> list[str]:
        unsupported = list(original(self))
        if not plugin_worker_selected(self):
            return unsupported
        if spec_pp_active(self):
            # Only PP + spec runs the plugin's async round. Without spec the
            # V1 runner's own PP + async path runs, which vLLM refuses (#45014).
            unsupported = [u for u in unsupported if u != PP_ASYNC_REFUSAL]
        return unsupported + pp_spec_unsupported(self)

    return wrapper


def _wrap_use_v2(original_prop: property) -> property:
    getter = original_prop.fget
    assert getter is not None

    @functools.wraps(getter)
    def wrapper(self: Any) -> bool:
        if not plugin_worker_selected(self):
            return bool(getter(self))
        import vllm.envs as envs

        if envs.VLLM_USE_V2_MODEL_RUNNER:
            raise ValueError(
                f"--worker-cls {WORKER_QUALNAME} extends vLLM's V1 model runner; "
                "unset VLLM_USE_V2_MODEL_RUNNER or set it to 0."
            )
        return False

    return property(wrapper)


def spec_pp_active(vllm_config: Any) -> bool:
    return (
        plugin_worker_selected(vllm_config)
        and vllm_config.speculative_config is not None
        and vllm_config.parallel_config.pipeline_parallel_size > 1
    )


def _wrap_max_concurrent_batches(original_prop: property) -> property:
    getter = original_prop.fget
    assert getter is not None

    @functools.wraps(getter)
    def wrapper(self: Any) -> int:
        if not spec_pp_active(self):
            return int(getter(self))
        return batches_in_flight(self)

    return property(wrapper)


def batches_in_flight(vllm_config: Any) -> int:
    """Batches the engine keeps in flight under PP + spec with the plugin."""
    if vllm_config.scheduler_config.async_scheduling:
        if lanes_enabled():
            return int(vllm_config.parallel_config.pipeline_parallel_size) + 1
        return 2
    if os.environ.get(ONE_BATCH_ENV) == "1":
        return 1
    return int(vllm_config.parallel_config.pipeline_parallel_size)


def lanes_enabled() -> bool:
    """Async scheduling under PP + spec pins requests to lanes, unless
    ``VLLM_PPSPEC_ASYNC_LANES=0`` (the two-batch mode, for comparison)."""
    return os.environ.get(LANES_ENV, "1") != "0"


def plugin_scheduler(vllm_config: Any) -> str | None:
    """The plugin scheduler's qualified name for this config, or None for vLLM's own."""
    if not spec_pp_active(vllm_config):
        return None
    if not vllm_config.scheduler_config.async_scheduling:
        return SCHEDULER_QUALNAME
    return LANE_SCHEDULER_QUALNAME if lanes_enabled() else None


ASYNC_NOTICE = (
    f"vllm-ppspec: async scheduling with pipeline parallelism and speculative decoding "
    f"runs without lanes ({LANES_ENV}=0): it keeps 2 batches in "
    "flight whatever the PP size, and its stages take turns (each step waits for the "
    "previous step's round from the last stage). For throughput under load drop "
    "--async-scheduling: sync scheduling keeps one batch per PP stage in flight. "
    "See docs/design.md, 'Async scheduling: lanes'."
)


AUTO_NOTICE = (
    "vllm-ppspec: pipeline parallelism with speculative decoding and --worker-cls auto: "
    f"selected the worker {WORKER_QUALNAME} ({AUTO_ENV}=0 keeps vLLM's own)"
)
FOREIGN_WARNING = (
    "vllm-ppspec: --worker-cls {worker} with pipeline parallelism and speculative "
    "decoding: vLLM's own V1 runner (0.32, 0.33) fails there at start-up; vllm-ppspec leaves "
    f"this worker alone (use --worker-cls auto or {WORKER_QUALNAME})"
)


def select_worker(vllm_config: Any) -> None:
    """PP > 1 with a speculative config and ``--worker-cls auto``: the plugin's worker.

    Runs before vLLM's ``VllmConfig.__post_init__`` (whose platform hook turns
    ``auto`` into vLLM's own worker), in every process that builds a config.
    ``VLLM_PPSPEC_AUTO=0`` turns it off; an explicit other worker is left alone,
    with a warning. Every other configuration is left as it is.
    """
    parallel = vllm_config.parallel_config
    if vllm_config.speculative_config is None or parallel.pipeline_parallel_size <= 1:
        return
    worker = parallel.worker_cls
    if worker == "auto":
        if os.environ.get(AUTO_ENV, "1") != "0":
            parallel.worker_cls = WORKER_QUALNAME
            _log_once("info", AUTO_NOTICE)
    elif not plugin_worker_selected(vllm_config):
        _log_once("warning", FOREIGN_WARNING.format(worker=worker))


def _log_once(level: str, msg: str) -> None:
    from vllm.logger import init_logger

    getattr(init_logger("vllm.ppspec"), f"{level}_once")(msg)


def refuses_pp_async_in_post_init() -> bool:
    """vLLM 0.33's ``__post_init__`` raises "Async scheduling is not supported by the
    V1 model runner with pipeline parallelism." for an explicit --async-scheduling
    (0.32 refuses it later, in ``_get_v1_model_runner_unsupported_features``)."""
    from vllm_ppspec.version_guard import vllm_at_least

    return vllm_at_least("0.33.0")


def hold_async(vllm_config: Any) -> bool:
    """Lift vLLM 0.33's PP + async refusal for PP + spec with the plugin's worker.

    Called before vLLM's ``__post_init__``. When the refusal applies, the
    explicit ``async_scheduling=True`` is replaced by ``False`` for the length
    of vLLM's checks (``False`` is an explicit choice: vLLM neither raises nor
    logs about it) and :func:`restore_async` puts it back. Returns whether it
    held it. Without spec, or with vLLM's own worker, vLLM's refusal stays.
    """
    if not (
        spec_pp_active(vllm_config)
        and vllm_config.scheduler_config.async_scheduling is True
        and refuses_pp_async_in_post_init()
    ):
        return False
    vllm_config.scheduler_config.async_scheduling = False
    return True


def restore_async(vllm_config: Any, dp_sync_unset: bool) -> None:
    """After vLLM's ``__post_init__``: async scheduling back on, with what vLLM's
    explicit-async branch does that the plugin needs (executor check, DP
    synchronisation over gloo instead of NCCL when the user left it unset)."""
    from vllm.v1.executor.abstract import Executor

    if not Executor.get_class(vllm_config).supports_async_scheduling():
        backend = vllm_config.parallel_config.distributed_executor_backend
        raise ValueError(f"`{backend}` does not support async scheduling yet.")
    vllm_config.scheduler_config.async_scheduling = True
    if dp_sync_unset:
        vllm_config.parallel_config.disable_nccl_for_dp_synchronization = True


def _wrap_post_init(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> None:
        select_worker(self)
        dp_sync_unset = self.parallel_config.disable_nccl_for_dp_synchronization is None
        held = hold_async(self)
        original(self)
        if held:
            restore_async(self, dp_sync_unset)
        if spec_pp_active(self) and self.scheduler_config.async_scheduling:
            if not lanes_enabled():
                _log_once("warning", ASYNC_NOTICE)
        qualname = plugin_scheduler(self)
        if qualname is None:
            return
        sched = self.scheduler_config
        if sched.scheduler_cls is None or sched.scheduler_cls == qualname:
            sched.scheduler_cls = qualname
            return
        from vllm_ppspec.sched.filled import PPSpecScheduler
        from vllm_ppspec.sched.lanes import PPSpecLaneScheduler

        base = PPSpecScheduler if qualname == SCHEDULER_QUALNAME else PPSpecLaneScheduler
        cls = sched.get_scheduler_cls()
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise ValueError(
                f"--scheduler-cls {sched.scheduler_cls!r} cannot run pipeline parallelism "
                f"with speculative decoding under vllm-ppspec: remove --scheduler-cls, or "
                f"subclass {qualname}"
            )

    return wrapper


def _wrap_post_step(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, model_executed: bool) -> None:
        from vllm_ppspec.sched.filled import PPSpecScheduler

        if isinstance(self.scheduler, PPSpecScheduler):
            return  # drafts come with each batch's output (draft_delivery)
        original(self, model_executed)

    return wrapper


def _wrap_cpu_check(original: Any) -> Any:
    func = original.__func__

    @functools.wraps(func)
    def wrapper(cls: Any, vllm_config: Any) -> None:
        requested = vllm_config.scheduler_config.async_scheduling
        func(cls, vllm_config)
        if requested is True and plugin_worker_selected(vllm_config):
            vllm_config.scheduler_config.async_scheduling = True

    return classmethod(wrapper)


def require_installed() -> None:
    """Raise unless this process runs with the patches (called by the workers).

    Without them (the ``ppspec`` plugin filtered out by ``VLLM_PLUGINS``, or
    its install failed and was undone) the V2 runner could be chosen and the
    batch queue would be PP-deep, which gives wrong tokens instead of an error.
    """
    from vllm.config.vllm import VllmConfig

    from vllm_ppspec.plugin import install_failure

    failure = install_failure()
    if failure is not None:
        raise RuntimeError(
            f"--worker-cls {WORKER_QUALNAME}: vllm-ppspec's vLLM plugin failed to install "
            f"its patches in this process ({failure}), so its worker cannot run; leave "
            "--worker-cls at auto for vLLM's own worker, or use a vLLM build the plugin "
            "installs on."
        )
    if not getattr(VllmConfig, _PATCHED_FLAG, False):
        raise RuntimeError(
            f"--worker-cls {WORKER_QUALNAME} needs vllm-ppspec's vLLM plugin 'ppspec', "
            "which was not loaded in this process: include 'ppspec' in VLLM_PLUGINS (or "
            "unset it) and check that vllm-ppspec is installed in this environment."
        )


def install() -> None:
    """Install the patches once per process (plugins may be loaded repeatedly)."""
    from vllm.config.vllm import VllmConfig

    if getattr(VllmConfig, _PATCHED_FLAG, False):
        return
    VllmConfig._get_v1_model_runner_unsupported_features = (  # type: ignore[method-assign]
        _wrap_unsupported_features(VllmConfig._get_v1_model_runner_unsupported_features)
    )
    VllmConfig.use_v2_model_runner = _wrap_use_v2(  # type: ignore[method-assign,assignment]
        VllmConfig.__dict__["use_v2_model_runner"]
    )
    VllmConfig.max_concurrent_batches = _wrap_max_concurrent_batches(  # type: ignore[method-assign,assignment]
        VllmConfig.__dict__["max_concurrent_batches"]
    )
    VllmConfig.__post_init__ = _wrap_post_init(VllmConfig.__post_init__)  # type: ignore[method-assign]
    from vllm.v1.engine.core import EngineCore

    EngineCore.post_step = _wrap_post_step(EngineCore.post_step)  # type: ignore[method-assign]
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.check_and_update_config = _wrap_cpu_check(  # type: ignore[method-assign]
        CpuPlatform.__dict__["check_and_update_config"]
    )
    setattr(VllmConfig, _PATCHED_FLAG, True)
