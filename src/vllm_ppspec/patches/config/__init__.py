"""Config checks that change when, and only when, the plugin worker is selected.

Installed by :func:`vllm_ppspec.plugin.register` in every vLLM process
(``install_group("config")``: this module's :func:`install`, then the other
``config`` entries of the registry, then :func:`mark_installed`). Each
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
* ``VllmConfig.use_v2_model_runner``: False with the plugin's worker (it extends
  the V1 runner); where vLLM requires V2 (``VLLM_USE_V2_MODEL_RUNNER=1``,
  HiSparse, watermarking) that worker is refused with a ValueError.
* ``CpuPlatform.check_and_update_config``: keeps an explicit
  ``--async-scheduling`` (the CPU platform turns it off unconditionally), also
  in the copies vLLM makes of that config (``ASYNC_KEPT_FLAG``).
* ``VllmConfig.max_concurrent_batches`` (PP + speculative decoding only):
  what :mod:`vllm_ppspec.policy` decides for the mode: under sync scheduling
  one batch per PP stage, as vLLM does without speculation (1 with
  ``VLLM_PPSPEC_ONE_BATCH=1``); under async scheduling PP + 1, one lane of
  requests per stage plus the next batch of the lane whose round is on its way.
* ``VllmConfig.__post_init__`` (PP + spec): first, with ``--worker-cls auto``
  (vLLM's default), selects the plugin's worker where vLLM would run its V1
  runner (:func:`select_worker`, :mod:`.worker_choice`; where vLLM picks Model
  Runner V2 it stays). Then selects the plugin's scheduler,
  :class:`vllm_ppspec.sched.filled.PPSpecScheduler` under sync scheduling (it
  applies each batch's drafts when that batch's output is processed) and
  :class:`vllm_ppspec.sched.lanes.PPSpecLaneScheduler` under async
  scheduling (requests pinned to lanes); an explicit other ``--scheduler-cls``
  is refused. On vLLM 0.33, which refuses an explicit ``--async-scheduling``
  with PP on the V1 runner inside ``__post_init__`` itself, it lifts that
  refusal for PP + spec only (:mod:`.async_hold`).
* ``EngineCore.post_step``: skipped with the sync scheduler. It would fetch
  the latest drafts with a blocking call that waits for the batch to leave
  the pipeline; the drafts come with the batch's output instead
  (:mod:`vllm_ppspec.sched.draft_delivery`). With either plugin scheduler it
  also installs the registry's ``engine core`` group (:mod:`.remote_reads`), once.
* ``get_engine_process_shutdown_timeout`` (:mod:`.stop_grace`): with the
  plugin's worker across nodes, a stop at ``--shutdown-timeout 0`` gives the
  engine core vLLM's best-effort window to stop its workers in order.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_ppspec import WORKER_QUALNAME, patches, policy
from vllm_ppspec.patches.config import stop_grace
from vllm_ppspec.patches.config.async_hold import hold_async, restore_async
from vllm_ppspec.policy import Mode
from vllm_ppspec.worker_choice import (
    AUTO_ENV,
    SUPPORTED_PP_METHODS,
    Choice,
    Decision,
    decide,
    facts_of,
    plugin_named,
    v2_refusal,
    v2_required,
)

PP_ASYNC_REFUSAL = "pipeline parallelism with async scheduling"

PATCHED_FLAG = "_vllm_ppspec_patched"
# Set on a scheduler config whose explicit --async-scheduling the plugin kept
# for its worker (the CPU hook's wrapper; 0.33's hold). vLLM's copies of a
# config (``replace``: the draft model's config, whose parallel config names no
# worker) share that object and run the platform hook again: the mark keeps
# them as the config they copy.
ASYNC_KEPT_FLAG = "_vllm_ppspec_async_kept"


def plugin_worker_selected(vllm_config: Any) -> bool:
    return plugin_named(getattr(vllm_config.parallel_config, "worker_cls", None))


def pp_spec_unsupported(vllm_config: Any) -> list[str]:
    """Reasons this PP or DP + speculative config cannot run with the plugin worker."""
    spec = vllm_config.speculative_config
    pp = vllm_config.parallel_config.pipeline_parallel_size
    dp = vllm_config.parallel_config.data_parallel_size
    if spec is None or (pp <= 1 and dp <= 1):
        return []
    reasons = []
    if spec.method not in SUPPORTED_PP_METHODS:
        reasons.append(
            f"speculative method {spec.method!r} with pipeline or data parallelism under "
            f"vllm-ppspec (supported: {', '.join(SUPPORTED_PP_METHODS)})"
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
        reason = v2_required(self)
        if reason is not None:
            raise ValueError(v2_refusal(reason))
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
    pp = int(vllm_config.parallel_config.pipeline_parallel_size)
    return policy.batches_in_flight(plugin_mode(vllm_config), pp)


def plugin_mode(vllm_config: Any) -> Mode:
    if not spec_pp_active(vllm_config):
        return Mode.OFF
    return policy.mode_of(
        True,
        int(vllm_config.parallel_config.pipeline_parallel_size),
        bool(vllm_config.scheduler_config.async_scheduling),
    )


AUTO_NOTICE = (
    "vllm-ppspec: speculative decoding with pipeline or data parallelism and --worker-cls "
    f"auto: selected the worker {WORKER_QUALNAME} ({AUTO_ENV}=0 keeps vLLM's own)"
)
V2_NOTICE = (
    "vllm-ppspec: vLLM's Model Runner V2 serves this configuration (speculative decoding "
    "with pipeline or data parallelism): the plugin leaves it alone ({why}; {auto}=always "
    "selects the plugin's worker)"
)
PLATFORM_NOTICE = (
    "vllm-ppspec: vLLM's own worker serves this configuration ({why}); the plugin changes nothing"
)
EXPLICIT_NOTICE = "vllm-ppspec: --worker-cls {worker}: {why}"
FOREIGN_WARNING = (
    "vllm-ppspec: --worker-cls {worker} with speculative decoding and pipeline or data "
    "parallelism: vLLM's V1 runner (0.32, 0.33) fails there; vllm-ppspec leaves "
    f"this worker alone (use --worker-cls auto or {WORKER_QUALNAME})"
)

# vLLM's own use_v2_model_runner getter, kept by install() before it is wrapped.
_vllm_use_v2: Any = None


def select_worker(vllm_config: Any) -> Decision:
    """Who serves (:mod:`.worker_choice`), applied to ``worker_cls``.

    Runs before vLLM's ``VllmConfig.__post_init__`` (whose platform hook turns
    ``auto`` into vLLM's own worker), in every process that builds a config.
    ``--worker-cls auto`` becomes the plugin's worker where the rule says so;
    the plugin's worker named on a line where vLLM picks Model Runner V2 and
    the plugin has nothing to do becomes ``auto`` again (vLLM's own worker
    serves); a refusal (another platform, V2 required) raises ValueError here;
    an explicit other worker is left alone, with a warning where it runs the
    V1 runner. A ``VLLM_PPSPEC_AUTO`` value the plugin does not take is refused.
    """
    decision = decide(facts_of(vllm_config, _vllm_use_v2))
    parallel = vllm_config.parallel_config
    worker = parallel.worker_cls
    if decision.choice is Choice.REFUSED:
        raise ValueError(decision.why)
    if decision.choice is Choice.PLUGIN and worker == "auto":
        parallel.worker_cls = WORKER_QUALNAME
        _log_once("info", AUTO_NOTICE)
    elif decision.choice is Choice.VLLM_V2 and plugin_named(worker):
        parallel.worker_cls = "auto"
        _log_once("info", EXPLICIT_NOTICE.format(worker=worker, why=decision.why))
    elif decision.choice is Choice.VLLM_V2 and worker == "auto":
        _log_once("info", V2_NOTICE.format(why=decision.why, auto=AUTO_ENV))
    elif decision.choice is Choice.OTHER_PLATFORM and worker == "auto":
        _log_once("info", PLATFORM_NOTICE.format(why=decision.why))
    elif decision.choice is Choice.VLLM_V1 and worker != "auto":
        if vllm_config.speculative_config.method in SUPPORTED_PP_METHODS:
            _log_once("warning", FOREIGN_WARNING.format(worker=worker))
    return decision


def _log_once(level: str, msg: str) -> None:
    from vllm.logger import init_logger

    getattr(init_logger("vllm.ppspec"), f"{level}_once")(msg)


def _wrap_post_init(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> None:
        select_worker(self)
        stop_grace.note_config(self, plugin_worker_selected(self))
        dp_sync_unset = self.parallel_config.disable_nccl_for_dp_synchronization is None
        held = hold_async(self, spec_pp_active(self))
        original(self)
        if held:
            restore_async(self, dp_sync_unset)
            setattr(self.scheduler_config, ASYNC_KEPT_FLAG, True)  # see _wrap_cpu_check
        qualname = policy.scheduler_of(plugin_mode(self))
        if qualname is None:
            return
        sched = self.scheduler_config
        if sched.scheduler_cls is None or sched.scheduler_cls == qualname:
            sched.scheduler_cls = qualname
            return
        if not policy.scheduler_serves(sched.get_scheduler_cls(), plugin_mode(self)):
            raise ValueError(
                f"--scheduler-cls {sched.scheduler_cls!r} cannot run pipeline parallelism "
                f"with speculative decoding under vllm-ppspec: remove --scheduler-cls, or "
                f"subclass {qualname}"
            )

    return wrapper


def _wrap_post_step(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, model_executed: bool) -> None:
        mode = getattr(self.scheduler, "ppspec_mode", None)
        if mode is not None and "engine core" not in patches.installed_groups:
            # This engine core runs a plugin scheduler: its patches (remote
            # reads that end when the executor shuts down) go in, once.
            patches.install_group("engine core")
        if mode is Mode.SYNC:
            return  # drafts come with each batch's output (draft_delivery)
        original(self, model_executed)

    return wrapper


def _wrap_cpu_check(original: Any) -> Any:
    func = original.__func__

    @functools.wraps(func)
    def wrapper(cls: Any, vllm_config: Any) -> None:
        sched = vllm_config.scheduler_config
        requested = sched.async_scheduling
        func(cls, vllm_config)
        if requested is True and (
            plugin_worker_selected(vllm_config) or getattr(sched, ASYNC_KEPT_FLAG, False)
        ):
            sched.async_scheduling = True
            setattr(sched, ASYNC_KEPT_FLAG, True)

    return classmethod(wrapper)


def installed() -> bool:
    """The ``config`` group is in this process (:func:`mark_installed` ran)."""
    from vllm.config.vllm import VllmConfig

    return bool(getattr(VllmConfig, PATCHED_FLAG, False))


def mark_installed() -> None:
    """Record that the whole ``config`` group went in (the workers check it)."""
    from vllm.config.vllm import VllmConfig

    setattr(VllmConfig, PATCHED_FLAG, True)


def install() -> None:
    """Wrap the config checks above (the ``config`` group's first entry); once."""
    from vllm.config.vllm import VllmConfig

    if installed():
        return
    VllmConfig._get_v1_model_runner_unsupported_features = (  # type: ignore[method-assign]
        _wrap_unsupported_features(VllmConfig._get_v1_model_runner_unsupported_features)
    )
    global _vllm_use_v2
    _vllm_use_v2 = VllmConfig.__dict__["use_v2_model_runner"].fget
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
