"""Config changes apply when, and only when, the plugin worker is selected.

These build real ``VllmConfig`` objects through ``EngineArgs`` on a tiny local
model (no engine is started).
"""

from __future__ import annotations

import pytest

from vllm_ppspec import WORKER_QUALNAME
from vllm_ppspec.compat import guard as version_guard
from vllm_ppspec.plugin import register

register()


@pytest.fixture(autouse=True)
def _no_automatic_worker(monkeypatch):
    """A config without ``worker_cls`` is vLLM's own worker in these tests
    (``VLLM_PPSPEC_AUTO=0``), unless a test asks for the automatic selection."""
    monkeypatch.setenv("VLLM_PPSPEC_AUTO", "0")


def test_pp_spec_with_worker_cls_auto_selects_the_plugin_worker(target, models, monkeypatch):
    monkeypatch.delenv("VLLM_PPSPEC_AUTO")
    cfg = _config(target, pipeline_parallel_size=2, speculative_config=_draft_copy(models))
    assert cfg.parallel_config.worker_cls == WORKER_QUALNAME
    # ... and the plugin's own patches then apply: its scheduler, its batches.
    assert cfg.scheduler_config.scheduler_cls == "vllm_ppspec.sched.filled.PPSpecScheduler"


def test_automatic_selection_changes_nothing_elsewhere_and_can_be_turned_off(
    target, models, monkeypatch
):
    from vllm.platforms import current_platform

    monkeypatch.delenv("VLLM_PPSPEC_AUTO")
    own = _config(target, pipeline_parallel_size=1, speculative_config=_draft_copy(models))
    nospec = _config(target, pipeline_parallel_size=2)
    assert not own.parallel_config.worker_cls.startswith("vllm_ppspec")
    assert not nospec.parallel_config.worker_cls.startswith("vllm_ppspec")
    monkeypatch.setenv("VLLM_PPSPEC_AUTO", "0")
    off = _config(target, pipeline_parallel_size=2, speculative_config=_draft_copy(models))
    assert not off.parallel_config.worker_cls.startswith("vllm_ppspec")
    assert current_platform.is_cpu()


def test_a_foreign_worker_cls_is_left_alone_with_a_warning(target, models, monkeypatch):
    from vllm_ppspec.patches.config import selection as config_patches

    monkeypatch.delenv("VLLM_PPSPEC_AUTO")
    said: list[str] = []
    monkeypatch.setattr(config_patches, "_log_once", lambda level, msg: said.append(msg))
    foreign = "vllm.v1.worker.cpu_worker.CPUWorker"
    cfg = _config(
        target,
        pipeline_parallel_size=2,
        worker_cls=foreign,
        speculative_config=_draft_copy(models),
    )
    assert cfg.parallel_config.worker_cls == foreign
    assert said == [config_patches.FOREIGN_WARNING.format(worker=foreign)]


def _async_plugin_config(model: str, models, pp: int, **extra):
    """PP = ``pp`` + draft_copy with the plugin's worker and --async-scheduling."""
    return _config(
        model,
        pipeline_parallel_size=pp,
        worker_cls=WORKER_QUALNAME,
        speculative_config=_draft_copy(models),
        async_scheduling=True,
        **extra,
    )


def _config(model: str, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model, dtype="float32", max_model_len=256, **kwargs
    ).create_engine_config()


@pytest.fixture(scope="module")
def target(models):
    return models["target"]


PP_ASYNC = "pipeline parallelism with async scheduling"


def _draft_copy(models):
    return {"method": "draft_model", "model": models["draft_copy"], "num_speculative_tokens": 3}


def test_v1_async_pp_refusal_is_lifted_for_pp_spec_with_the_plugin_worker_only(target, models):
    from vllm.config.vllm import VllmConfig

    ours = _config(
        target,
        pipeline_parallel_size=2,
        worker_cls=WORKER_QUALNAME,
        speculative_config=_draft_copy(models),
    )
    ours.scheduler_config.async_scheduling = True
    assert PP_ASYNC not in ours._get_v1_model_runner_unsupported_features()
    # vLLM's own check, unwrapped, still refuses this config.
    assert PP_ASYNC in VllmConfig._get_v1_model_runner_unsupported_features.__wrapped__(ours)
    stock = _config(target, pipeline_parallel_size=2, speculative_config=_draft_copy(models))
    stock.scheduler_config.async_scheduling = True
    assert PP_ASYNC in stock._get_v1_model_runner_unsupported_features()


def test_pp_async_without_spec_with_the_plugin_worker_is_as_vllms_own(target):
    """Without spec the plugin does not act, so its worker named does what vLLM's
    own does: vLLM's #45014 refusal stays in the unsupported features; 0.33
    refuses in ``__post_init__``; 0.32's CPU platform turns async off (the
    plugin keeps an explicit ``--async-scheduling`` only where it acts)."""
    nospec = _config(target, pipeline_parallel_size=2, worker_cls=WORKER_QUALNAME)
    nospec.scheduler_config.async_scheduling = True
    assert PP_ASYNC in nospec._get_v1_model_runner_unsupported_features()

    def built(worker: str):
        return _config(target, pipeline_parallel_size=2, worker_cls=worker, async_scheduling=True)

    if version_guard.vllm_at_least("0.33.0"):
        refusal = "Async scheduling is not supported by the V1 model runner with pipeline"
        for worker in (WORKER_QUALNAME, "auto"):
            with pytest.raises(ValueError, match=refusal):
                built(worker)
    else:
        assert built(WORKER_QUALNAME).scheduler_config.async_scheduling is False
        assert built("auto").scheduler_config.async_scheduling is False


def test_pp_async_spec_config_is_accepted_with_the_plugin_worker(target, models):
    cfg = _async_plugin_config(target, models, 2)
    assert cfg.scheduler_config.async_scheduling is True
    # As vLLM's explicit-async branch sets it (0.33: put back by restore_async).
    assert cfg.parallel_config.disable_nccl_for_dp_synchronization is True
    assert cfg.scheduler_config.scheduler_cls == "vllm_ppspec.sched.lanes.PPSpecLaneScheduler"


def test_pp_async_spec_with_vllms_own_worker_keeps_vllms_refusal(target, models):
    """The async lift is for the plugin's worker only. With vLLM's own, each
    version does what it does without the plugin: 0.33 refuses in
    ``__post_init__``; 0.32's CPU platform turns async scheduling off."""

    def stock():
        return _config(
            target,
            pipeline_parallel_size=2,
            speculative_config=_draft_copy(models),
            async_scheduling=True,
        )

    if version_guard.vllm_at_least("0.33.0"):
        refusal = "Async scheduling is not supported by the V1 model runner with pipeline"
        with pytest.raises(ValueError, match=refusal):
            stock()
    else:
        assert stock().scheduler_config.async_scheduling is False


def test_cpu_platform_keeps_explicit_async_scheduling_for_the_plugin_worker(target, models):
    spec = _draft_copy(models)
    ours = _config(
        target,
        pipeline_parallel_size=2,
        worker_cls=WORKER_QUALNAME,
        speculative_config=spec,
        async_scheduling=True,
    )
    assert ours.scheduler_config.async_scheduling is True
    default = _config(
        target, pipeline_parallel_size=2, worker_cls=WORKER_QUALNAME, speculative_config=spec
    )
    assert default.scheduler_config.async_scheduling is False


def test_sync_scheduling_is_the_default_on_cpu(target, models, monkeypatch):
    """PP + a model drafter on the CPU backend, as a user starts it (no
    --async-scheduling, the plugin's worker chosen automatically): sync
    scheduling and the filled pipeline. vLLM's CPU platform turns async off;
    the plugin keeps it only when asked (``_wrap_cpu_check``). Lanes measured
    no faster than the filled pipeline there (design.md, "Batches in flight
    under async scheduling, measured")."""
    monkeypatch.delenv("VLLM_PPSPEC_AUTO")
    cfg = _config(target, pipeline_parallel_size=2, speculative_config=_draft_copy(models))
    assert cfg.parallel_config.worker_cls == WORKER_QUALNAME
    assert cfg.scheduler_config.async_scheduling is False
    assert cfg.scheduler_config.scheduler_cls == "vllm_ppspec.sched.filled.PPSpecScheduler"


@pytest.mark.parametrize("pp", [1, 2])
def test_the_kept_async_survives_the_draft_models_copy_of_the_config(target, models, pp):
    """vLLM's draft-model proposer builds its config as ``replace(target config,
    parallel_config=<the draft's, worker_cls auto>, ...)``: a copy sharing the
    scheduler config, whose ``__post_init__`` runs the CPU platform hook again.
    The async the plugin kept must stay, or the runner (built async) and the
    scheduler (built after the drafter loads) disagree and nothing is drafted
    (measured at PP=1 with draft_model: 0 drafts against 342 without async)."""
    from dataclasses import replace

    ours = _async_plugin_config(target, models, pp)
    spec = ours.speculative_config
    draft = replace(
        ours,
        parallel_config=replace(spec.draft_parallel_config, rank=0),
        model_config=spec.draft_model_config,
    )
    assert draft.scheduler_config is ours.scheduler_config
    # Kept where the plugin acts (PP = 2); at PP = 1 it does not, and vLLM's CPU
    # platform turns async off for the config and its copy alike.
    assert ours.scheduler_config.async_scheduling is (pp > 1)


def test_plugin_worker_always_uses_the_v1_runner(target, monkeypatch):
    cfg = _config(target, worker_cls=WORKER_QUALNAME)
    assert cfg.use_v2_model_runner is False
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER=1 requires Model Runner V2"):
        cfg.use_v2_model_runner  # noqa: B018


def test_unsupported_method_under_pp_is_refused_with_the_supported_list(target):
    with pytest.raises(ValueError) as e:
        _config(
            target,
            pipeline_parallel_size=2,
            worker_cls=WORKER_QUALNAME,
            # ngram_gpu: a method of vLLM 0.32 and 0.33 the plugin does not run under PP
            speculative_config={"method": "ngram_gpu", "num_speculative_tokens": 3},
        )
    assert "'ngram_gpu'" in str(e.value)
    assert "ngram, draft_model, eagle, eagle3, mtp" in str(e.value)


def test_workers_refuse_to_run_without_the_plugin_patches(monkeypatch):
    from vllm.config.vllm import VllmConfig

    from vllm_ppspec.patches.install_state import require_installed

    require_installed()  # register() above installed them
    monkeypatch.delattr(VllmConfig, "_vllm_ppspec_patched")
    with pytest.raises(RuntimeError, match="include 'ppspec' in VLLM_PLUGINS"):
        require_installed()


def _ngram():
    return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def test_sync_pp_spec_fills_the_pipeline_with_the_plugin_scheduler(target, monkeypatch):
    from vllm_ppspec.choice.policy import ONE_BATCH_ENV, SCHEDULER_QUALNAME

    for pp in (2, 3):
        cfg = _config(
            target,
            pipeline_parallel_size=pp,
            worker_cls=WORKER_QUALNAME,
            speculative_config=_ngram(),
        )
        assert cfg.max_concurrent_batches == pp
        assert cfg.scheduler_config.scheduler_cls == SCHEDULER_QUALNAME
    monkeypatch.setenv(ONE_BATCH_ENV, "1")
    # The plan read the switch when the config was settled: not again.
    assert cfg.max_concurrent_batches == 3
    one = _config(
        target, pipeline_parallel_size=2, worker_cls=WORKER_QUALNAME, speculative_config=_ngram()
    )
    assert one.max_concurrent_batches == 1  # the comparison mode of the benchmark
    # Not touched: stock worker, or no speculative decoding.
    stock = _config(target, pipeline_parallel_size=2, speculative_config=_ngram())
    assert stock.scheduler_config.scheduler_cls is None
    nospec = _config(target, pipeline_parallel_size=2, worker_cls=WORKER_QUALNAME)
    assert nospec.scheduler_config.scheduler_cls is None
    assert nospec.max_concurrent_batches == 2


@pytest.mark.parametrize("pp", [2, 3])
def test_async_pp_spec_keeps_pp_plus_1_batches_with_the_lane_scheduler(target, models, pp):
    from vllm_ppspec.sched.lanes import PPSpecLaneScheduler

    cfg = _async_plugin_config(target, models, pp)
    assert cfg.max_concurrent_batches == pp + 1
    assert cfg.scheduler_config.get_scheduler_cls() is PPSpecLaneScheduler


def test_async_pp_spec_runs_lanes_at_dp_2_too(target, models):
    # Lanes were off at DP > 1 until the first round stopped blocking
    # (transport.RoundChannel.agree_shape at start-up; docs/design.md, "Lanes
    # at DP > 1"); tests/test_e2e_dp.py's async cases run them.
    from vllm_ppspec.sched.lanes import PPSpecLaneScheduler

    cfg = _config(
        target,
        pipeline_parallel_size=2,
        data_parallel_size=2,
        worker_cls=WORKER_QUALNAME,
        speculative_config=_draft_copy(models),
        async_scheduling=True,
    )
    assert cfg.parallel_config.data_parallel_size == 2
    assert cfg.max_concurrent_batches == 3
    assert cfg.scheduler_config.get_scheduler_cls() is PPSpecLaneScheduler


def test_another_scheduler_class_is_refused_under_async_pp_spec(target, models):
    with pytest.raises(ValueError, match="subclass vllm_ppspec.sched.lanes"):
        _async_plugin_config(
            target, models, 2, scheduler_cls="vllm.v1.core.sched.async_scheduler.AsyncScheduler"
        )


def test_another_scheduler_class_is_refused_under_pp_spec(target):
    with pytest.raises(ValueError, match="remove --scheduler-cls"):
        _config(
            target,
            pipeline_parallel_size=2,
            worker_cls=WORKER_QUALNAME,
            speculative_config=_ngram(),
            scheduler_cls="vllm.v1.core.sched.scheduler.Scheduler",
        )


def test_engine_post_step_skips_the_blocking_draft_fetch_with_the_plugin_scheduler():
    from vllm.v1.engine.core import EngineCore

    from vllm_ppspec.sched.filled import PPSpecScheduler

    class _Executor:
        calls = 0

        def take_draft_token_ids(self):
            _Executor.calls += 1

    def engine(scheduler):
        core = object.__new__(EngineCore)
        core.scheduler = scheduler
        core.model_executor = _Executor()
        core.check_for_draft_tokens = True
        core.async_scheduling = False
        return core

    EngineCore.post_step(engine(object.__new__(PPSpecScheduler)), True)
    assert _Executor.calls == 0
    EngineCore.post_step(engine(object()), True)  # vLLM's own path still fetches
    assert _Executor.calls == 1


def _pp_spec_namespace(
    backend: str,
    async_scheduling: bool,
    method: str = "draft_model",
    pp: int = 2,
    dp: int = 1,
    moe: bool = False,
):
    """A config with the plugin's worker selected, as the refusals read it."""
    from types import SimpleNamespace

    from vllm_ppspec import WORKER_QUALNAME

    return SimpleNamespace(
        speculative_config=SimpleNamespace(method=method),
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=pp,
            data_parallel_size=dp,
            distributed_executor_backend=backend,
            worker_cls=WORKER_QUALNAME,
        ),
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        model_config=SimpleNamespace(is_moe=moe, is_hybrid=False),
        cache_config=SimpleNamespace(enable_prefix_caching=False),
    )


@pytest.mark.parametrize("v2", ["0", "1"])
def test_async_with_the_legacy_ray_executor_is_refused_and_ray_v2_is_not(monkeypatch, v2):
    """vLLM's legacy Ray executor calls sample_tokens on the last PP rank only,
    which both async modes need on every rank; RayExecutorV2 (vLLM's default)
    runs the plugin's worker as the mp executor does. Ray itself refuses the
    CPU platform, so this checks the refusal's logic on a config stand-in."""
    import vllm.envs as envs

    from vllm_ppspec.patches.config.refusals import legacy_ray_async, pp_spec_unsupported

    monkeypatch.setenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", v2)
    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    # vLLM 0.33 has RayExecutorV2 only: its "ray" backend is never the legacy one.
    legacy = v2 == "0" and not version_guard.vllm_at_least("0.33.0")
    reasons = pp_spec_unsupported(_pp_spec_namespace("ray", True))
    assert legacy_ray_async(_pp_spec_namespace("ray", True)) is legacy
    assert any("legacy Ray executor" in r for r in reasons) is legacy, reasons
    if legacy:
        assert "VLLM_USE_RAY_V2_EXECUTOR_BACKEND" in " ".join(reasons)
    # Sync scheduling and the mp executor are never refused for it.
    assert not legacy_ray_async(_pp_spec_namespace("ray", False))
    assert not legacy_ray_async(_pp_spec_namespace("mp", True))


@pytest.mark.parametrize(
    ("pp", "dp", "moe"), [(2, 1, False), (1, 2, True), (2, 2, False), (2, 2, True)]
)
def test_a_method_the_plugin_does_not_run_is_refused_with_its_worker_where_it_acts(pp, dp, moe):
    from vllm_ppspec.choice.worker import SUPPORTED_PP_METHODS
    from vllm_ppspec.patches.config.refusals import pp_spec_unsupported

    assert {"medusa", "custom_class", "suffix"} <= set(SUPPORTED_PP_METHODS)
    reasons = pp_spec_unsupported(_pp_spec_namespace("mp", False, "ngram_gpu", pp, dp, moe))
    assert reasons == [
        "speculative method 'ngram_gpu' with pipeline parallelism, or data parallelism on a "
        "MoE model, under vllm-ppspec: its proposer keeps CUDA buffers and events, and the "
        "plugin runs it nowhere: on CUDA with Triton vLLM's Model Runner V2 serves it under "
        "PP; elsewhere use method 'ngram' "
        f"(methods vllm-ppspec runs under PP: {', '.join(SUPPORTED_PP_METHODS)})"
    ]


@pytest.mark.parametrize(("pp", "dp", "moe"), [(1, 1, False), (1, 2, False), (1, 1, True)])
def test_the_plugins_worker_named_off_its_lines_refuses_nothing(pp, dp, moe):
    """PP = 1 with a dense DP (independent DP=1 engines) or no DP: the plugin's
    worker runs as vLLM's own V1 worker, whatever the method."""
    from vllm_ppspec.patches.config.refusals import pp_spec_unsupported

    assert pp_spec_unsupported(_pp_spec_namespace("mp", False, "ngram_gpu", pp, dp, moe)) == []


# vLLM's explicit-async refusals other than PP: each version's own message, the
# plugin's worker or not (on 0.33 only the PP refusal is lifted, patches/config/async_hold.py).
ASYNC_REFUSALS = {
    "ngram": (
        "Async scheduling is not supported by the V1 model runner with ngram-based",
        "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model",
    ),
    "disable_padded_drafter_batch": (
        "Async scheduling is not supported by the V1 model runner with "
        "disable_padded_drafter_batch=True",
        "Async scheduling is not compatible with disable_padded_drafter_batch=True",
    ),
}


def async_refusal(case: str) -> str:
    on_033, on_032 = ASYNC_REFUSALS[case]
    return on_033 if version_guard.vllm_at_least("0.33.0") else on_032


@pytest.mark.parametrize("worker", [WORKER_QUALNAME, "auto"])
def test_ngram_with_async_scheduling_is_refused_by_vllm_on_every_version(models, worker):
    from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec

    target, spec = tiny_spec(models, "ngram", 3)
    with pytest.raises(ValueError, match=async_refusal("ngram")):
        _config(
            models[target],
            pipeline_parallel_size=2,
            worker_cls=worker,
            speculative_config=spec,
            async_scheduling=True,
        )


def test_disable_padded_drafter_batch_with_async_is_refused_by_vllm_on_every_version(models):
    spec = {**_draft_copy(models), "disable_padded_drafter_batch": True}
    with pytest.raises(ValueError, match=async_refusal("disable_padded_drafter_batch")):
        _config(
            models["target"],
            pipeline_parallel_size=2,
            worker_cls=WORKER_QUALNAME,
            speculative_config=spec,
            async_scheduling=True,
        )


def test_the_pp_async_refusal_alone_is_lifted_on_every_version(models):
    """The lift still holds for the methods the lanes run (draft_model here)."""
    cfg = _config(
        models["target"],
        pipeline_parallel_size=2,
        worker_cls=WORKER_QUALNAME,
        speculative_config=_draft_copy(models),
        async_scheduling=True,
    )
    assert cfg.scheduler_config.async_scheduling is True


def test_the_docs_of_the_rule_and_the_start_up_say_what_the_code_does():
    """Issue 39, item 6: texts that had gone stale. The config patches name the
    rule (PP, or DP on a MoE model), not "PP + spec"; the mixin names the
    placement check's collectives as ``placement.pp_on_one_host`` calls them;
    the orderly stop and reliability.md say that a worker under vLLM's mp
    executor ignores SIGINT and that a host with ``VLLM_PPSPEC_AUTO=0`` is
    refused at once."""
    import ast

    import vllm_ppspec.patches.config as config_patches
    from tests.conftest import REPO
    from vllm_ppspec.runner.health import orderly_stop, placement

    doc = config_patches.__doc__ or ""
    assert "plugin_line" in doc and "under PP + spec" not in doc
    assert "``VllmConfig.__post_init__`` (PP + spec)" not in doc
    tree = ast.parse((REPO / "src/vllm_ppspec/runner/health/placement.py").read_text())
    func = next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "pp_on_one_host"
    )
    called = {
        n.func.attr
        for n in ast.walk(func)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    mixin = (REPO / "src/vllm_ppspec/runner/mixin.py").read_text()
    said = mixin.split("the placement check (``placement.pp_on_one_host``:")[1].split(")")[0]
    for name in ("broadcast", "all_reduce", "all_gather_object"):
        assert (name in said) is (name in called), (name, said, sorted(called))
    assert placement.pp_on_one_host is not None
    stop_doc = orderly_stop.__doc__ or ""
    assert "gets\nSIGINT or SIGTERM" not in stop_doc and "ignores SIGINT" in stop_doc
    reliability = (REPO / "docs/reliability.md").read_text()
    assert "never reaches the check" not in reliability
    assert "The test fails on it, as it did before." not in reliability


def test_external_launcher_with_async_is_refused_naming_why_on_each_version(target, models):
    """The plugin refuses async scheduling with the external launcher. On 0.33
    vLLM's V1 check runs while async is held (async_hold), so the refusal is
    asked again once it is back; 0.32 names it from vLLM's own check."""
    with pytest.raises(ValueError, match="async scheduling with the external_launcher PP mode"):
        _async_plugin_config(target, models, 2, distributed_executor_backend="external_launcher")
