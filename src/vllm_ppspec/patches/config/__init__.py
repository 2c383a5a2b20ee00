"""Config checks that change when, and only when, the plugin worker is selected.

Installed by :func:`vllm_ppspec.plugin.register` in every vLLM process
(``install_group("config")``: this module's :func:`install`, then the other
``config`` entries of the registry, then :func:`mark_installed`). Each
patch wraps one vLLM function and calls it unchanged unless
``parallel_config.worker_cls`` names a vllm-ppspec worker (which it does by
itself, when left at ``auto``, on the lines the plugin serves: speculative
decoding with PP > 1, or DP > 1 on a MoE model, ``choice.worker.plugin_line``;
see ``__post_init__``). Each wrapper reads the config's plan
(:func:`vllm_ppspec.choice.plan.plan_of`: who serves, the mode, the batches in
flight, the scheduler), settled once at the end of ``__post_init__``:

* ``VllmConfig._get_v1_model_runner_unsupported_features``: where the mode is
  not off, drops "pipeline parallelism with async scheduling" (the plugin runs
  that combination, see below); where the plugin acts, adds the combinations it
  does not support (:mod:`.refusals`), so vLLM raises its usual ``ValueError``
  naming them. Without speculative decoding vLLM's refusal
  stays: vLLM refuses PP + async scheduling on the V1 runner because
  structured outputs desync the grammar FSM there (vLLM issue #45014, the
  note in that function), and the plugin changes nothing on that path.
* ``VllmConfig.use_v2_model_runner``: False with the plugin's worker (it extends
  the V1 runner); where vLLM requires V2 (``VLLM_USE_V2_MODEL_RUNNER=1``,
  HiSparse, watermarking) that worker is refused with a ValueError.
* ``CpuPlatform.check_and_update_config``: where the plugin acts, keeps an explicit
  ``--async-scheduling`` (the CPU platform turns it off unconditionally), also
  in the copies vLLM makes of that config (``ASYNC_KEPT_FLAG``).
* ``VllmConfig.max_concurrent_batches`` (mode not off only):
  what :mod:`vllm_ppspec.choice.policy` decides for the mode: under sync scheduling
  one batch per PP stage, as vLLM does without speculation (1 with
  ``VLLM_PPSPEC_ONE_BATCH=1``); under async scheduling PP + 1, one lane of
  requests per stage plus the next batch of the lane whose round is on its way.
* ``VllmConfig.__post_init__``: first, with ``--worker-cls auto`` (vLLM's
  default), selects the plugin's worker on the lines it serves where vLLM would
  run its V1 runner (:func:`.selection.select_worker`, :mod:`vllm_ppspec.choice.worker`;
  where vLLM picks Model Runner V2 it stays). Then, mode not off, selects the plugin's scheduler,
  :class:`vllm_ppspec.sched.filled.PPSpecScheduler` under sync scheduling (it
  applies each batch's drafts when that batch's output is processed) and
  :class:`vllm_ppspec.sched.lanes.PPSpecLaneScheduler` under async
  scheduling (requests pinned to lanes); an explicit other ``--scheduler-cls``
  is refused. On vLLM 0.33, which refuses an explicit ``--async-scheduling``
  with PP on the V1 runner inside ``__post_init__`` itself, it lifts that
  refusal where the mode is not off only (:mod:`.async_hold`). With
  ``VLLM_PPSPEC_ADAPTIVE_K=1``, mode not off, it stands a static-K schedule in
  for the one the plugin's scheduler will measure
  (:func:`.adaptive_k.stand_in`).
* ``EngineCore.post_step``: skipped with the sync scheduler. It would fetch
  the latest drafts with a blocking call that waits for the batch to leave
  the pipeline; the drafts come with the batch's output instead
  (:mod:`vllm_ppspec.sched.draft_delivery`). With either plugin scheduler it
  also installs the registry's ``engine core`` group (:mod:`.remote_reads`), once.
* ``get_engine_process_shutdown_timeout`` (:mod:`.stop_grace`): with the
  plugin acting on a pipeline across nodes, a stop at ``--shutdown-timeout 0`` gives the
  engine core vLLM's best-effort window to stop its workers in order.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_ppspec import adaptive_k, patches
from vllm_ppspec.choice import policy
from vllm_ppspec.choice.plan import decide, plan_of, settle
from vllm_ppspec.choice.policy import Mode
from vllm_ppspec.choice.worker import v2_refusal, v2_required
from vllm_ppspec.patches.config import selection, stop_grace
from vllm_ppspec.patches.config.async_hold import hold_async, restore_async
from vllm_ppspec.patches.config.refusals import pp_spec_unsupported
from vllm_ppspec.patches.config.selection import select_worker

PP_ASYNC_REFUSAL = "pipeline parallelism with async scheduling"

PATCHED_FLAG = "_vllm_ppspec_patched"
# Set on a scheduler config whose explicit --async-scheduling the plugin kept
# for its worker (the CPU hook's wrapper; 0.33's hold). vLLM's copies of a
# config (``replace``: the draft model's config, whose parallel config names no
# worker) share that object and run the platform hook again: the mark keeps
# them as the config they copy.
ASYNC_KEPT_FLAG = "_vllm_ppspec_async_kept"


def _wrap_unsupported_features(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> list[str]:
        unsupported = list(original(self))
        plan = plan_of(self)
        if not plan.worker:
            return unsupported
        if plan.serves_pp:
            # Only the plugin's modes run its async round. Elsewhere (PP
            # without spec) the V1 runner's own PP + async path runs, which
            # vLLM refuses (#45014).
            unsupported = [u for u in unsupported if u != PP_ASYNC_REFUSAL]
        return unsupported + pp_spec_unsupported(self)

    return wrapper


def _wrap_use_v2(original_prop: property) -> property:
    getter = original_prop.fget
    assert getter is not None

    @functools.wraps(getter)
    def wrapper(self: Any) -> bool:
        if not plan_of(self).worker:
            return bool(getter(self))
        reason = v2_required(self)
        if reason is not None:
            raise ValueError(v2_refusal(reason))
        return False

    return property(wrapper)


def _wrap_max_concurrent_batches(original_prop: property) -> property:
    getter = original_prop.fget
    assert getter is not None

    @functools.wraps(getter)
    def wrapper(self: Any) -> int:
        n = plan_of(self).batches_in_flight
        return int(getter(self)) if n is None else n

    return property(wrapper)


def _wrap_post_init(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any) -> None:
        select_worker(self)
        # Who serves is known once the worker is selected; the mode is settled
        # after vLLM's own __post_init__ (which settles async scheduling).
        serving = decide(self)
        stop_grace.note_config(self, serving.acts)
        dp_sync_unset = self.parallel_config.disable_nccl_for_dp_synchronization is None
        held = hold_async(self, serving.serves_pp)
        if adaptive_k.stand_in(self, serving.serves_pp):
            setattr(self.speculative_config, adaptive_k.STAND_IN_FLAG, True)
        original(self)
        if held:
            restore_async(self, dp_sync_unset)
            setattr(self.scheduler_config, ASYNC_KEPT_FLAG, True)  # see _wrap_cpu_check
        plan = settle(self)
        qualname = plan.scheduler
        if qualname is None:
            return
        sched = self.scheduler_config
        if sched.scheduler_cls is None or sched.scheduler_cls == qualname:
            sched.scheduler_cls = qualname
            return
        if not policy.scheduler_serves(sched.get_scheduler_cls(), plan.mode):
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
            plan_of(vllm_config).acts or getattr(sched, ASYNC_KEPT_FLAG, False)
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
    selection.vllm_use_v2 = VllmConfig.__dict__["use_v2_model_runner"].fget
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
