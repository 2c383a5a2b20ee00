"""Hold what the drift tool knows of vLLM releases without the V1 runner (0.34.0 on).

The V1 runner's modules (:data:`V1_RUNNER_MODULES`: every name the plugin uses
in them is gone with the runner), the other drift of 0.34.0 read and explained
(:data:`EXPLAINED_0_34`, merged into ``version_data.EXPLAINED_DRIFT``), and
the Model Runner V2 names a port of the plugin would subclass, wrap or call
(:data:`V2_RUNNER_NAMES`: the names of docs/on-model-runner-v2.md, which
tests/test_v2_runner_page.py keeps equal to this list). ``vllm_ppspec_tools.drift``
reports each of these present or missing on a release without the V1 runner.
No vLLM import.
"""

from __future__ import annotations

# The modules of the V1 runner, its proposers and its sampler, absent from
# 0.34.0 on: a plugin name in one of them is explained there by the removal.
V1_RUNNER_MODULES: tuple[str, ...] = (
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.worker.gpu_input_batch",
    "vllm.v1.worker.block_table",
    "vllm.v1.spec_decode.llm_base_proposer",
    "vllm.v1.spec_decode.draft_model",
    "vllm.v1.spec_decode.suffix_decoding",
    "vllm.v1.spec_decode.utils",
    "vllm.v1.sample.rejection_sampler",
)
REMOVED_WITH_THE_V1_RUNNER = (
    "removed with the V1 runner: Model Runner V2 is vLLM's only runner here, and the "
    "plugin's V1 runner, worker and patches do not run (its hook installs nothing, its "
    "worker is refused: no_v1_runner.py)"
)

# What of the plugin's V1 code is not run on 0.34.0 and why each difference
# does not matter there; docs/on-model-runner-v2.md reads the ones a port would
# build on (the worker's runner factory, the schedulers, the engine's steps).
_NOT_RUN = "the plugin does not run on 0.34.0 (no V1 runner), so its {what} is never applied"
EXPLAINED_0_34: dict[str, str] = {
    "vllm.config.vllm:VllmConfig.use_v2_model_runner": (
        "gone: V2 is the only runner (VLLM_USE_V2_MODEL_RUNNER=0 raises 'Model Runner V1 "
        "has been removed'); " + _NOT_RUN.format(what="V1-or-V2 wrapper")
    ),
    "vllm.config.vllm:VllmConfig._get_v1_model_runner_unsupported_features": (
        "gone with the V1 runner's refusals; " + _NOT_RUN.format(what="wrapper")
    ),
    "vllm.utils.cpu_triton_utils:_expand_kernel_impl": (
        "gone with the V1 rejection sampler's CPU expand; "
        + _NOT_RUN.format(what="replacement (patches/worker/cpu_expand.py)")
    ),
    "vllm.config.vllm:VllmConfig.__post_init__": (
        "draft max_model_len limit, float KV-cache check, submodel-view hash lookahead; "
        + _NOT_RUN.format(what="async-refusal copy (0.33 only) or wrapper")
    ),
    "vllm.v1.core.sched.scheduler:Scheduler._make_cached_request_data": (
        "changed; " + _NOT_RUN.format(what="lane book's copy (protocol/lane_book.py)")
    ),
    "vllm.v1.worker.gpu_worker:Worker._make_model_runner": (
        "builds V2's GPUModelRunner (vllm/v1/worker/gpu/model_runner.py) with no V1 "
        "branch: the hook a V2 port would override (docs/on-model-runner-v2.md); "
        + _NOT_RUN.format(what="override")
    ),
    "vllm.v1.worker.gpu_worker:Worker.execute_model": (
        "the use_v2_model_runner test dropped around pool(); " + _NOT_RUN.format(what="override")
    ),
    "vllm.v1.worker.gpu_worker:Worker.init_device": ("changed; " + _NOT_RUN.format(what="wrapper")),
    "vllm.v1.worker.cpu_worker:CPUWorker.init_device": (
        "builds V2's CPUModelRunner (or the standalone one off x86 without Triton); "
        + _NOT_RUN.format(what="override")
    ),
    "vllm.v1.core.sched.scheduler:Scheduler.__init__": (
        "changed; " + _NOT_RUN.format(what="schedulers' subclass")
    ),
    "vllm.v1.core.sched.scheduler:Scheduler.schedule": (
        "changed; " + _NOT_RUN.format(what="filled-pipeline scheduler")
    ),
    "vllm.v1.core.sched.scheduler:Scheduler.update_from_output": (
        "changed; " + _NOT_RUN.format(what="filled-pipeline scheduler")
    ),
    "vllm.v1.core.sched.scheduler:Scheduler.update_draft_token_ids": (
        "drafts trimmed by structured outputs (trim_spec_tokens); "
        + _NOT_RUN.format(what="scheduler")
    ),
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler.__init__": (
        "the placeholder list and pp_size attribute dropped; "
        + _NOT_RUN.format(what="lane scheduler")
    ),
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler._update_after_schedule": (
        "changed; " + _NOT_RUN.format(what="lane scheduler")
    ),
    "vllm.config.vllm:VllmConfig.max_concurrent_batches": (
        "async scheduling always PP + 1 (no V1 case); " + _NOT_RUN.format(what="wrapper")
    ),
    "vllm.platforms.cpu:CpuPlatform.check_and_update_config": (
        "changed (it still turns async scheduling off); " + _NOT_RUN.format(what="wrapper")
    ),
    "vllm.v1.engine.utils:get_engine_process_shutdown_timeout": (
        "changed; " + _NOT_RUN.format(what="stop-grace wrapper")
    ),
    "vllm.distributed.parallel_state:initialize_model_parallel": (
        "changed; " + _NOT_RUN.format(what="deployment-check wrapper")
    ),
}

# (module, qualified name) of every Model Runner V2 name a port of the plugin
# would subclass, wrap or call (docs/on-model-runner-v2.md, "The names").
V2_RUNNER_NAMES: tuple[tuple[str, str], ...] = (
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.execute_model"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample_tokens"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.update_pp_decode_requests"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.postprocess_sampled"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.take_draft_token_ids"),
    ("vllm.v1.worker.gpu.pp_utils", "PPHandler"),
    ("vllm.v1.worker.gpu.pp_utils", "PPHandler.receive"),
    ("vllm.v1.worker.gpu.pp_utils", "PPHandler.broadcast"),
    ("vllm.v1.worker.gpu.pp_utils", "PPHandler.broadcast_drafts"),
    ("vllm.v1.worker.gpu.pp_utils", "PPHandler.get_prev_sampled_outputs"),
    ("vllm.v1.worker.gpu.pp_utils", "compute_need_sampled_mask"),
    ("vllm.v1.worker.cpu.model_runner", "CPUModelRunner"),
    ("vllm.v1.worker.gpu_worker", "Worker._make_model_runner"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.init_device"),
    ("vllm.v1.core.sched.scheduler", "Scheduler"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.schedule"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output"),
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler._update_after_schedule"),
    ("vllm.v1.engine.core", "EngineCore.post_step"),
    ("vllm.v1.engine.core", "EngineCore.step_with_batch_queue"),
    ("vllm.v1.executor.multiproc_executor", "MultiprocExecutor.execute_model"),
    ("vllm.v1.executor.multiproc_executor", "MultiprocExecutor.take_draft_token_ids"),
    ("vllm.config.vllm", "VllmConfig.max_concurrent_batches"),
    ("vllm.platforms.cpu", "CpuPlatform.check_and_update_config"),
    ("vllm.platforms.cpu", "CpuPlatform.uses_standalone_cpu_model_runner"),
    ("vllm.distributed.parallel_state", "GroupCoordinator.make_sibling_device_group"),
    ("vllm.distributed.parallel_state", "in_the_same_node_as"),
)
