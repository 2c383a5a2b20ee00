"""The registry's data: every change the plugin makes to vLLM, by group (``Patch.when``).

Read through :mod:`vllm_ppspec.patches` (its docstring says what each group
is and where it is installed); the ``runner`` group's entries are in
:mod:`.registry_runner`. No vLLM import.
"""

from __future__ import annotations

from vllm_ppspec.compat.patch import Patch
from vllm_ppspec.compat.registry_runner import RUNNER_PATCHES

REGISTRY: tuple[Patch, ...] = (
    Patch(
        module="vllm_ppspec.patches.config",
        when="config",
        targets=(
            "vllm.config.vllm:VllmConfig._get_v1_model_runner_unsupported_features",
            "vllm.config.vllm:VllmConfig.use_v2_model_runner",
            "vllm.config.vllm:VllmConfig.max_concurrent_batches",
            "vllm.config.vllm:VllmConfig.__post_init__",
            "vllm.platforms.cpu:CpuPlatform.check_and_update_config",
            "vllm.v1.engine.core:EngineCore.post_step",
        ),
        why=(
            "vLLM refuses PP + async scheduling on the V1 runner, picks the V2 runner, keeps "
            "one batch in flight under PP + spec, turns --async-scheduling off on CPU, and "
            "fetches drafts with a call that waits for the batch to leave the pipeline."
        ),
        how=(
            "Wrappers that call vLLM's function unchanged unless the plugin worker is "
            "selected; with it, under PP + spec: the plugin's refusals instead of vLLM's, "
            "the V1 runner, PP (sync) or PP + 1 (lanes) batches, the plugin's scheduler, "
            "no post_step draft fetch; with VLLM_PPSPEC_ADAPTIVE_K=1 a static-K "
            "num_speculative_tokens_per_batch_size where none is given, so vLLM treats K as "
            "dynamic (the plugin's scheduler replaces the schedule)."
        ),
        upstream="vLLM #45014 (PP + async refusal), #46994, #52071 (PP + spec on V1)",
        remove_when="vLLM runs speculative decoding under PP on the runner users run",
        attributes=(
            "VllmConfig._vllm_ppspec_patched",  # PATCHED_FLAG: the group is in (mark_installed)
            "SchedulerConfig._vllm_ppspec_async_kept",  # ASYNC_KEPT_FLAG
            # config/adaptive_k.py's STAND_IN_FLAG: adaptive K's stand-in schedule
            "SpeculativeConfig._vllm_ppspec_adaptive_k",
        ),
    ),
    Patch(
        module="vllm_ppspec.patches.config.stop_grace",
        when="config",
        targets=("vllm.v1.engine.utils:get_engine_process_shutdown_timeout",),
        why=(
            "at vLLM's default --shutdown-timeout 0 a SIGTERM to vllm serve SIGKILLs the "
            "engine core's workers at once: across hosts they cannot say goodbye, and the "
            "other node reports a dead peer (an ERROR, 'died unexpectedly')"
        ),
        how=(
            "with the plugin's worker on a pipeline across nodes (mp, PP > 1, a DP replica "
            "spanning nodes) only, where vLLM "
            "gives no window of its own: the window VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS "
            "(5 s), as vLLM gives ROCm; requests are still aborted at once"
        ),
        upstream=(
            "none found; vllm/v1/engine/utils.py:get_engine_process_shutdown_timeout "
            "(ROCm's window; 0.33 adds the variable)"
        ),
        remove_when="vLLM stops an mp executor's workers in order at --shutdown-timeout 0",
    ),
    Patch(
        module="vllm_ppspec.patches.config.deployment_check",
        when="config",
        targets=("vllm.distributed.parallel_state:initialize_model_parallel",),
        why=(
            "each host and DP replica decides alone who serves (VLLM_PPSPEC_AUTO, "
            "VLLM_USE_V2_MODEL_RUNNER): a rank running vLLM's own worker beside the "
            "plugin's would be found only by the runner's start-up timeout, or never"
        ),
        how=(
            "after vLLM built its groups, where the world has more than one rank and the "
            "config's plan checks the deployment (a line the plugin serves: speculative "
            "decoding with PP > 1, or DP > 1 on a MoE model, whoever's worker): each rank "
            "posts its worker, runner, mode and vLLM release on the world group's store; "
            "a rank where the plugin acts waits for every post and raises on a difference "
            "on every rank, naming it; a rank where it does not act watches for that "
            "refusal from a thread until the start-up timeout. Elsewhere nothing is "
            "posted and no thread starts"
        ),
        upstream="none found; vllm/distributed/parallel_state.py:initialize_model_parallel",
        remove_when="vLLM serves speculative decoding with PP and DP on the runner users run",
    ),
    Patch(
        module="vllm_ppspec.patches.config.async_hold",
        when="config",
        targets=("vllm.config.vllm:VllmConfig.__post_init__",),
        why=(
            "vLLM 0.33 raises 'Async scheduling is not supported by the V1 model runner "
            "with pipeline parallelism.' inside __post_init__ for an explicit "
            "--async-scheduling with PP > 1, before any hook the plugin has"
        ),
        how=(
            "under PP + spec with the plugin's worker only, and only when the PP refusal is "
            "the one vLLM would raise (patches.config.async_hold.v1_async_refusal_besides_pp): "
            "vLLM's checks see async_scheduling=False, then the explicit True is put back "
            "with what vLLM's explicit-async branch does (executor check, DP sync without "
            "NCCL): hold_async, restore_async"
        ),
        upstream="vllm/config/vllm.py:VllmConfig.__post_init__ (0.33.0, v1_async_sched_incompat)",
        remove_when="vLLM runs PP + spec + async scheduling on the runner users run",
        versions=("0.33.0",),
        install=None,  # applied by patches.config's VllmConfig.__post_init__ wrapper
    ),
    Patch(
        module="vllm_ppspec.patches.worker.cpu_shm_names",
        when="worker",
        targets=(
            "vllm.distributed.device_communicators.cpu_communicator:"
            "_CPUSHMDistributed._init_cpu_shm",
        ),
        why=(
            "vLLM's CPU SHM communicator removes its /dev/shm segment names only in a "
            "destructor that a signalled or os._exit-ed worker never runs: every stopped "
            "CPU engine leaves them, and a later group with the same name fails (errno 17)"
        ),
        how=(
            "after vLLM's function returned (every rank has mapped every segment), each "
            "rank removes its own segment's name; the mappings stay until the processes end"
        ),
        upstream="none found; vllm/distributed/device_communicators/cpu_communicator.py",
        remove_when="vLLM's CPU communicator removes its segment names once mapped",
        attributes=("_CPUSHMDistributed._init_cpu_shm._vllm_ppspec_unlinks_names",),
        cpu_only=True,
    ),
    Patch(
        module="vllm_ppspec.patches.engine_core.remote_reads",
        when="engine core",
        targets=("vllm.distributed.device_communicators.shm_broadcast:MessageQueue.dequeue",),
        why=(
            "across hosts the executor waits for a remote worker's reply in one zmq poll "
            "for the whole RPC timeout (300 s), even after its worker monitor shut the "
            "queues down: with a PP peer dead, /health stays 200 and requests hang until then"
        ),
        how=(
            "in an engine core running a plugin scheduler (install_group('engine core') from "
            "patches.config's post_step wrapper, once), remote readers only, whatever "
            "--nnodes says: a remote reader polls in 0.1 s slices and raises "
            "RuntimeError('cancelled') once its queue is shut down, as a local reader does"
        ),
        upstream=(
            "none found for the remote reader's dequeue (related: vLLM #23985, errors of "
            "non-output ranks wait the RPC timeout; PR #58059, the same cancel for start-up "
            "waits); vllm/distributed/device_communicators/shm_broadcast.py"
        ),
        remove_when="vLLM's remote MessageQueue reads end on shutdown",
        attributes=("MessageQueue.dequeue._vllm_ppspec_cancellable",),  # the wrapper's mark
    ),
    Patch(
        module="vllm_ppspec.patches.worker.cpu_expand",
        when="worker",
        targets=("vllm.v1.sample.rejection_sampler:expand_kernel",),
        why=(
            "vLLM's CPU fallback (cpu_triton_utils._expand_kernel_impl) writes into a "
            "temporary int64 copy: greedy rows change beside sampled ones."
        ),
        how="registers a torch expand_kernel over vLLM's fallback when Triton is absent",
        upstream=(
            "vLLM PR #42638 (expand_batch_to_tokens on CPU, closed unmerged); "
            "vllm/utils/cpu_triton_utils.py:_expand_kernel_impl, unchanged in 0.33.0"
        ),
        remove_when="vLLM's CPU expand fallback writes into its output tensor",
        cpu_only=True,
    ),
    Patch(
        module="vllm_ppspec.patches.worker.cpu_eager",
        when="worker",
        targets=("vllm.v1.worker.gpu_model_runner:update_num_computed_tokens_for_batch_change",),
        why="inductor compiles the async spec-decode correction on CPU while requests wait",
        how="points the runner module's name at the uncompiled function",
        upstream=("none found; vllm/v1/spec_decode/utils.py (torch.compile with the CPU backend)"),
        remove_when="vLLM runs that correction eagerly on CPU",
        cpu_only=True,
    ),
    Patch(
        module="vllm_ppspec.patches.worker.cpu_ngram_threads",
        when="worker",
        targets=("vllm.v1.spec_decode.ngram_proposer:NgramProposer.batch_propose",),
        why=(
            "the ngram proposer restores numba's thread count, the core count, with "
            "omp_set_num_threads: torch then runs more OpenMP threads than the cores "
            "vLLM bound the worker to"
        ),
        how=(
            "with the ngram method only, after vLLM's init_device bound the worker's threads: "
            "sets numba's thread count to torch's"
        ),
        upstream="none found; vllm/v1/spec_decode/ngram_proposer.py:NgramProposer.batch_propose",
        remove_when="vLLM's ngram proposer leaves the OpenMP thread count as it found it",
        cpu_only=True,
        after_init=True,
        # ngram_proposer imports numba, whose llvmlite ffi object breaks the module
        # scan of vLLM's register_kernels (cpu_expand, at init_device): not imported early.
        checked_at_import=False,
    ),
    Patch(
        module="vllm_ppspec.patches.worker.cpu_moe",
        when="worker",
        targets=(
            "vllm.distributed.device_communicators.cpu_communicator:CpuCommunicator.all_gatherv",
            "vllm.distributed.device_communicators.cpu_communicator:CpuCommunicator.reduce_scatterv",
        ),
        why="vLLM's CPU communicator raises NotImplementedError: MoE at DP > 1 fails on CPU",
        how="gloo all_gather / all_reduce implementations on the communicator's group",
        upstream=(
            "vLLM #57837 (CpuCommunicator lacks the variable-size collectives), PR #47778 "
            "(CPU MoE DP/EP, open)"
        ),
        remove_when="tests/test_e2e_dp.py::test_stock_worker_still_fails... starts failing",
        cpu_only=True,
    ),
    Patch(
        module="vllm_ppspec.patches.engine_core.remote_reads",
        when="worker",
        targets=("vllm.distributed.device_communicators.shm_broadcast:MessageQueue.dequeue",),
        why=(
            "on a headless node the worker waits for the leader's next call in a remote "
            "read that ignores its queue's shutdown: when a peer's goodbye stops that node "
            "in order, vLLM's executor waits 5 s, then SIGTERMs and SIGKILLs the worker"
        ),
        how=(
            "the plugin's worker (CPU or GPU) on a headless node (node_rank_within_dp > 0, "
            "mp executor) installs the engine core's wrap at init_device: the read ends "
            "within 0.1 s of the shutdown, as vLLM's own stop of a worker does"
        ),
        upstream="none found; vllm/distributed/device_communicators/shm_broadcast.py",
        remove_when="vLLM's remote MessageQueue reads end on shutdown",
        install="install_on_headless_worker",
    ),
    Patch(
        module="vllm_ppspec.workers.cpu",
        when="worker",
        targets=("vllm.v1.worker.cpu_worker:CPUModelRunner",),
        why="CPUWorker.init_device builds its runner by this module-level name",
        how=(
            "PPSpecCPUWorker.init_device points the name at the plugin's CPU runner for its "
            "call of vLLM's init_device, then restores it"
        ),
        upstream="none found (not a bug); vllm/v1/worker/cpu_worker.py:CPUWorker.init_device",
        remove_when="vLLM lets a worker choose its runner class",
        install=None,  # for one call, in the worker's init_device
        cpu_only=True,
    ),
) + RUNNER_PATCHES


# The vLLM names wrapped in place in every process ("config" entries), as
# (module, qualname): the plugin hook undoes them on a failed install, and
# the drift tool compares their upstream bodies release to release.
PATCHED_NAMES: tuple[tuple[str, str], ...] = tuple(
    dict.fromkeys(
        tuple(target.split(":"))  # type: ignore[misc]
        for patch in REGISTRY
        if patch.when == "config"
        for target in patch.targets
    )
)


# Every registry target (checked_at_import) as (module, qualname), for the version check's
# PRIVATE_NAMES (compat/guard.py): each must exist in every supported release.
PATCHED_PRIVATE_NAMES: tuple[tuple[str, str], ...] = tuple(
    dict.fromkeys(
        tuple(target.split(":"))  # type: ignore[misc]
        for patch in REGISTRY
        if patch.checked_at_import
        for target in patch.targets
    )
)
