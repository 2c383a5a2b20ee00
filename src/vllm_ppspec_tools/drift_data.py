"""Hold what the drift tool knows of vLLM releases without the V1 runner (0.34.0 on).

The V1 runner's modules (:data:`V1_RUNNER_MODULES`: every name the plugin uses
in them is gone with the runner), the other drift of 0.34.0 read and explained
(:data:`EXPLAINED_0_34`), the drift read and explained per release (:data:`EXPLAINED_DRIFT`), and
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
    ("vllm.v1.worker.gpu.spec_decode.utils", "DraftTokensHandler.get_draft_tokens"),
    ("vllm.v1.worker.gpu.dp_utils", "dispatch_cg_and_sync_dp"),
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
    ("vllm.v1.executor.multiproc_executor", "MultiprocExecutor.collective_rpc"),
    ("vllm.config.vllm", "VllmConfig.max_concurrent_batches"),
    ("vllm.platforms.cpu", "CpuPlatform.check_and_update_config"),
    ("vllm.platforms.cpu", "CpuPlatform.uses_standalone_cpu_model_runner"),
    ("vllm.platforms.interface", "Platform.validate_environ"),
    ("vllm.distributed.parallel_state", "GroupCoordinator.make_sibling_device_group"),
    ("vllm.distributed.parallel_state", "in_the_same_node_as"),
)


# Per vLLM release: drift the drift tool may report that has been read and
# handled ("module:qualname" -> what the plugin does about it). A release is
# supported once its drift is all explained here and its e2e cases pass.
# docs/design.md, "vLLM 0.33", says the same at more length. 0.34.0 removed the
# V1 runner and is not supported: its drift beside the V1 runner's modules is
# in EXPLAINED_0_34 above.
EXPLAINED_DRIFT: dict[str, dict[str, str]] = {
    "0.33.0": {
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._maybe_share_embeddings": (
            "an EAGLE-flagged head whose embed_tokens has no weight (0.33's NemotronH MTP "
            "builds it as None) is now shared at any width instead of raising: "
            "embedding_share.share_mode returns REPLACE on 0.33, and the hand-over installs "
            "the target's embedding in its place (TP = 1); pinned per version"
        ),
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner._build_attention_metadata": (
            "the multimodal prefix ranges moved into compute_mm_prefix_ranges; its uses "
            "of self.drafter, which the plugin hides on non-last ranks, are unchanged"
        ),
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner.__init__": (
            "the medusa proposer is gone (0.33's config has no medusa method; the plugin "
            "runs medusa on 0.32 only) and the plugin calls __init__ unchanged"
        ),
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids": (
            "its medusa branch is gone with 0.33's medusa proposer; the plugin's override "
            "(runner/mixin.py) calls it unchanged, inside the suffix drafter's scope "
            "(runner/drafter/suffix_requests.py) for method suffix only"
        ),
        "vllm.v1.core.sched.scheduler:Scheduler.__init__": (
            "new state (deferred async loads, local prefill cadence, can_skip_drafts, "
            "hash lookahead) set before the plugin's schedulers add theirs; can_skip_drafts "
            "is False on the V1 runner the plugin uses, so every step still drafts"
        ),
        "vllm.v1.core.sched.scheduler:Scheduler.schedule": (
            "local prefill cadence (off at the default prefill_schedule_interval 1), "
            "skip_drafts (False on V1), priority self-preemption, aux-output caps: "
            "the plugin's schedule_without still hides requests from it and calls it "
            "unchanged; the e2e cases on the overlay check the tokens"
        ),
        "vllm.v1.core.sched.scheduler:Scheduler.update_from_output": (
            "caches blocks up to num_computed_tokens - num_in_flight_tokens after each "
            "output under spec (sync too), and re-enqueues resumable requests; "
            "num_in_flight_tokens is kept by the base class's own schedule / update, "
            "which the plugin's schedulers call, so blocks of a batch still in the "
            "pipeline are not cached"
        ),
        "vllm.distributed.parallel_state:initialize_model_parallel": (
            "DeepseekV41's engram DP group may span the whole DP group and then reuses it; "
            "patches.config.deployment_check's wrapper calls it unchanged and gathers on the world "
            "group only after it returned"
        ),
        "vllm.v1.engine.utils:get_engine_process_shutdown_timeout": (
            "an explicitly set VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS now gives the window on "
            "every platform: patches.config.stop_grace keeps any window vLLM gives and adds "
            "its own (that variable's value) only where vLLM's is still 0"
        ),
        "vllm.v1.worker.gpu_worker:Worker.init_device": (
            "the local GPU index now comes from parallel_config.get_local_gpu_index, and "
            "cuBLAS handles are made before the memory snapshot (CUDA only); the plugin's "
            "wrapper (runner/health/orderly_stop.StopsInOrder.init_device) only records the node "
            "kind and installs the remote-read patch before calling it unchanged"
        ),
        "vllm.config.vllm:VllmConfig.__post_init__": (
            "an explicit --async-scheduling with PP > 1 on the V1 runner now raises here, "
            "before the platform hook: patches.config.async_hold lifts that refusal alone, for "
            "PP + spec with the plugin's worker (0.33 only); its other explicit-async refusals "
            "(ngram, disable_padded_drafter_batch) stay vLLM's"
        ),
        "vllm.config.vllm:VllmConfig._get_v1_model_runner_unsupported_features": (
            "new refusals (xpress, draft lm_head quantization, the Parse MTP draft) that "
            "the plugin keeps; it still drops only 'pipeline parallelism with async "
            "scheduling' under PP + spec"
        ),
        "vllm.config.vllm:VllmConfig.use_v2_model_runner": (
            "the Triton fallback warning skips the unspecified platform; the plugin's "
            "wrapper returns False (V1) with its worker, as before"
        ),
        "vllm.platforms.cpu:CpuPlatform.check_and_update_config": (
            "the default CPU block size is no longer forced to 128; the hook still turns "
            "async scheduling off, and the plugin's wrapper still keeps an explicit one"
        ),
    },
    "0.34.0": EXPLAINED_0_34,
}
