"""The runner mixin: vLLM's V1 runner overrides, each dispatching by mode.

Mixed into vLLM's ``GPUModelRunner`` (:class:`PPSpecGPUModelRunner`) and
``CPUModelRunner`` (:class:`vllm_ppspec.runner.cpu.PPSpecCPUModelRunner`). The
mode (:mod:`vllm_ppspec.runner.mode`) is chosen once, in ``_ppspec_setup``,
and logged; every override asks it which path to take. The parts own their
state:

* :mod:`~vllm_ppspec.runner.sync_steps` (``SYNC``),
  :mod:`~vllm_ppspec.runner.lane_steps` (``LANES``),
  :mod:`~vllm_ppspec.runner.two_batch` (``TWO_BATCH``);
* :mod:`~vllm_ppspec.runner.drafter_scope`: the drafter hidden on non-last
  ranks, and shown a single-stage PP group on the last;
* :mod:`~vllm_ppspec.runner.embedding_handover`: the target's embedding for
  the drafter; :mod:`~vllm_ppspec.runner.eagle3`: EAGLE-3 auxiliary states;
* :mod:`~vllm_ppspec.runner.clocks`: where each rank's time goes;
* :mod:`~vllm_ppspec.runner.rank_errors` and :mod:`~vllm_ppspec.runner.peer_watch`:
  a failing rank, or a dead PP peer, ends the engine.

Every vLLM private name the package uses is listed in
:mod:`vllm_ppspec.version_guard`. PP + spec with the external-launcher
(torchrun) PP mode is refused by the config check and again here.

Collectives the plugin adds, on every rank of the PP group unless said:

* once at set-up, in this order, when the mode is not ``OFF``: the round shape
  ``all_reduce`` (``RoundChannel.agree_shape``; ``LANES`` and ``TWO_BATCH``
  only), then the peer watcher's ``all_gather_object`` of listening addresses
  (``peer_watch.watch_pp_peers``);
* once after ``load_model``, mode not ``OFF``: the embedding hand-over's header
  ``all_reduce``, and if vLLM would share the target's embedding with the
  drafter a digest ``all_reduce`` and, if the drafter's values differ, a
  ``broadcast`` from the first rank (``embedding_handover``);
* per step, ``LANES`` and ``TWO_BATCH``: one round message from the last rank
  to each other rank (``isend`` there, ``irecv`` on each receiver, gloo
  ``cpu_group``; see those parts for who posts it when); none in ``SYNC``;
* at DP > 1 (MoE targets), per drafter run, on every rank holding a drafter,
  whatever the mode: one ``all_gather`` on the DP group's ``cpu_group`` before
  the drafter's first forward (:mod:`vllm_ppspec.protocol.dp_agreement`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from vllm_ppspec.version_guard import check_vllm

check_vllm()

# The imports below need a supported vLLM: the guard above runs first.
from vllm.distributed.parallel_state import get_dp_group, get_pp_group  # noqa: E402
from vllm.logger import init_logger  # noqa: E402
from vllm.sequence import IntermediateTensors  # noqa: E402
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

from vllm_ppspec.protocol import dp_agreement, faults  # noqa: E402
from vllm_ppspec.protocol.rounds import RoundChannel  # noqa: E402
from vllm_ppspec.runner import eagle3  # noqa: E402
from vllm_ppspec.runner.clocks import Clocks  # noqa: E402
from vllm_ppspec.runner.drafter_scope import drafter_hidden, isolate_drafter  # noqa: E402
from vllm_ppspec.runner.embedding_handover import give_drafter_the_target_embedding  # noqa: E402
from vllm_ppspec.runner.lane_steps import LaneSteps, lane_scheduler_selected  # noqa: E402
from vllm_ppspec.runner.mode import Mode, choose_mode  # noqa: E402
from vllm_ppspec.runner.peer_watch import watch_pp_peers  # noqa: E402
from vllm_ppspec.runner.placement import peer_watch_host  # noqa: E402
from vllm_ppspec.runner.startup_check import agree, fingerprint  # noqa: E402
from vllm_ppspec.runner.sync_steps import SyncSteps  # noqa: E402
from vllm_ppspec.runner.two_batch import TwoBatchSteps  # noqa: E402
from vllm_ppspec.sched.draft_delivery import attach_drafts  # noqa: E402

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

logger = init_logger("vllm.ppspec")


class PPSpecRunnerMixin:
    """Mixin for vLLM's V1 GPUModelRunner (and its CPU subclass)."""

    # Provided by GPUModelRunner.
    speculative_config: Any
    input_batch: Any
    requests: dict[str, Any]
    device: torch.device
    use_async_scheduling: bool
    num_spec_tokens: int
    broadcast_pp_output: bool

    # Class defaults: vLLM's own __init__ may reach an override before
    # _ppspec_setup runs; until then every override calls straight through.
    _ppspec_mode: Mode = Mode.OFF
    _ppspec_is_last: bool = True
    _ppspec_sync: SyncSteps | None = None
    _ppspec_lanes: LaneSteps | None = None
    _ppspec_two_batch: TwoBatchSteps | None = None
    _ppspec_faults: faults.Faults = faults.Faults()
    _ppspec_fault_step: int = 0  # non-last ranks: execute_model calls (fault injection)
    _ppspec_deferred: Callable[[], None] | None = None
    _ppspec_captured: torch.Tensor | None = None  # last rank: what vLLM just sampled

    @property
    def ppspec_active(self) -> bool:
        """Speculative decoding under PP on this runner (the mode is not OFF)."""
        return self._ppspec_mode is not Mode.OFF

    @property
    def ppspec_clocks(self) -> Clocks:
        clocks = self.__dict__.get("_ppspec_clocks")
        if clocks is None:
            clocks = self.__dict__["_ppspec_clocks"] = Clocks()
        return clocks

    def _model_forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.ppspec_clocks.timing("forward_s"):
            return super()._model_forward(*args, **kwargs)  # type: ignore[misc]

    # ------------------------------------------------------------------
    # Set-up: the mode and its part
    # ------------------------------------------------------------------
    def _ppspec_setup(self) -> None:
        """Called right after GPUModelRunner.__init__ (drafter already built)."""
        pp = get_pp_group()
        mode = choose_mode(
            bool(self.speculative_config),
            pp.world_size,
            self.use_async_scheduling,
            lambda: lane_scheduler_selected(self.vllm_config),  # type: ignore[attr-defined]
        )
        self._ppspec_mode = mode
        self._ppspec_is_last = pp.is_last_rank
        # DP > 1 (MoE targets): this rank's drafter agrees with the other DP
        # ranks' on each run (protocol/dp_agreement.py), in every mode.
        self._ppspec_install_dp_agreement()
        if mode is Mode.OFF:
            return
        if self.broadcast_pp_output:
            raise ValueError(
                "vllm-ppspec does not support speculative decoding with the "
                "external_launcher (torchrun) PP mode; use the default mp executor "
                "(--distributed-executor-backend mp) or remove --speculative-config."
            )
        # The plugin's first collective: every PP rank was started the same way
        # (one host or several), or every rank refuses (startup_check.py).
        agree(pp.cpu_group, fingerprint(self, mode.value))
        self._ppspec_faults = faults.Faults.from_env()
        if self._ppspec_faults.any():
            logger.warning(
                "vllm-ppspec: test fault injection on non-last ranks: %s", self._ppspec_faults
            )
        if mode in (Mode.SYNC, Mode.LANES):
            # Lanes make each step sync-shaped: the same rebuilds apply.
            hybrid = bool(self.model_config.is_hybrid)  # type: ignore[attr-defined]
            skip = self._ppspec_faults.skip_state_replay
            self._ppspec_sync = SyncSteps(self._ppspec_is_last, hybrid, skip)
        if mode.exchanges_rounds:
            # One message per round, last rank to the others, of a static
            # size; every PP rank agrees on the shape here, in start-up order:
            # after it, posting a round never blocks (protocol/rounds.py).
            channel = RoundChannel(
                pp.cpu_group,
                pp.last_rank,
                self.max_num_reqs,  # type: ignore[attr-defined]
                self.num_spec_tokens,
            )
            channel.agree_shape()
            if mode is Mode.LANES:
                # Each step reaches vLLM's runner as sync scheduling would send
                # it, so its sync path runs; rounds still travel from the last
                # rank, one per step, completed PP steps later.
                self.use_async_scheduling = False
                self.use_async_spec_decode = False  # type: ignore[attr-defined]
                self._ppspec_lanes = LaneSteps(
                    channel,
                    pp.world_size,
                    pp.rank_in_group,
                    self._ppspec_is_last,
                    self._ppspec_faults,
                    self.ppspec_clocks,
                )
            else:
                self._ppspec_two_batch = TwoBatchSteps(
                    channel,
                    self._ppspec_is_last,
                    pp.rank_in_group,
                    self._ppspec_faults,
                    self.ppspec_clocks,
                )
        if self._ppspec_is_last:
            isolate_drafter(self.drafter)  # type: ignore[attr-defined]
        # Every PP rank, once, here, in this order on the PP gloo group: the
        # placement check (placement.py), then the peer watch's address
        # exchange. A dead peer ends this worker (peer_watch.py), over the
        # loopback when the ranks share this host, else on this node's address.
        watch_pp_peers(pp.cpu_group, peer_watch_host(pp.cpu_group))
        logger.info(
            "vllm-ppspec: PP rank %d/%d, speculative method %s, k=%d, %s scheduling",
            pp.rank_in_group,
            pp.world_size,
            self.speculative_config.method,
            self.num_spec_tokens,
            mode.value,
        )

    def _ppspec_install_dp_agreement(self) -> None:
        """On a rank holding a model drafter at DP > 1, install the DP agreement."""
        drafter = getattr(self, "drafter", None)
        if not isinstance(drafter, SpecDecodeBaseProposer):  # none here, or no model forward
            return
        if self.parallel_config.data_parallel_size <= 1:  # type: ignore[attr-defined]
            return
        fault = faults.Faults.from_env()
        dp = get_dp_group()
        dp_agreement.install(
            drafter,
            dp.cpu_group,
            dp.rank_in_group,
            disagree_at=fault.at_step if fault.kind == "dp_disagree" else 0,
        )
        logger.info(
            "vllm-ppspec: drafter runs agreed across DP (rank %d of %d) on the DP gloo group",
            dp.rank_in_group,
            dp.world_size,
        )

    # ------------------------------------------------------------------
    # Non-last ranks have no drafter: hide it from vLLM's set-up and metadata paths.
    # ------------------------------------------------------------------
    def _ppspec_hides_drafter(self) -> bool:
        return self.ppspec_active and not self._ppspec_is_last

    def _dummy_run(self, *args: Any, **kwargs: Any) -> Any:
        with drafter_hidden(self, self._ppspec_hides_drafter()):
            return super()._dummy_run(*args, **kwargs)  # type: ignore[misc]

    def _build_attention_metadata(self, *args: Any, **kwargs: Any) -> Any:
        with drafter_hidden(self, self._ppspec_hides_drafter()):
            return super()._build_attention_metadata(*args, **kwargs)  # type: ignore[misc]

    def initialize_metadata_builders(self, *args: Any, **kwargs: Any) -> Any:
        with drafter_hidden(self, self._ppspec_hides_drafter()):
            return super().initialize_metadata_builders(*args, **kwargs)  # type: ignore[misc]

    def _check_and_update_cudagraph_mode(self, *args: Any, **kwargs: Any) -> Any:
        with drafter_hidden(self, self._ppspec_hides_drafter()):
            return super()._check_and_update_cudagraph_mode(  # type: ignore[misc]
                *args, **kwargs
            )

    def initialize_kv_cache(self, *args: Any, **kwargs: Any) -> Any:
        with drafter_hidden(self, self._ppspec_hides_drafter()):
            return super().initialize_kv_cache(*args, **kwargs)  # type: ignore[misc]

    # ------------------------------------------------------------------
    # Load time: the target's embedding for the drafter; EAGLE-3 states.
    # ------------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> Any:
        result = super().load_model(*args, **kwargs)  # type: ignore[misc]
        if self.ppspec_active:
            give_drafter_the_target_embedding(self, get_pp_group(), self._ppspec_is_last)
        return result

    def _setup_eagle3_aux_hidden_state_outputs(self) -> None:
        vllm_setup = super()._setup_eagle3_aux_hidden_state_outputs  # type: ignore[misc]
        if self._ppspec_mode is Mode.OFF or not eagle3.uses_aux_states(self.speculative_config):
            vllm_setup()
            return
        model = self.model  # type: ignore[attr-defined]
        eagle3.set_up(model, self.speculative_config, self._ppspec_is_last, vllm_setup)

    # ------------------------------------------------------------------
    # Every step
    # ------------------------------------------------------------------
    def _update_states(self, scheduler_output: SchedulerOutput) -> Any:
        sync = self._ppspec_sync
        if sync is not None:
            sync.before_update_states(self.requests, scheduler_output)
        deferred = super()._update_states(scheduler_output)  # type: ignore[misc]
        if deferred is not None and self.ppspec_active and not self._ppspec_is_last:
            deferred = self._ppspec_run_once(deferred)
        self._ppspec_deferred = deferred
        if self._ppspec_two_batch is not None:
            self._ppspec_two_batch.after_update_states(self, scheduler_output)
        if sync is not None:
            sync.after_update_states(self, scheduler_output)
        return deferred

    def _ppspec_run_once(self, correction: Callable[[], None]) -> Callable[[], None]:
        """Wrap vLLM's deferred async count correction so that it runs once per step.

        vLLM returns the correction from ``_update_states`` and, in
        ``GPUModelRunner.execute_model``, runs it before the forward when
        ``mamba_cache_mode == "align"`` and otherwise after the forward, on the
        last rank only (non-last ranks return their intermediate tensors
        first). ``execute_model`` below runs it on non-last ranks after the
        forward; whoever calls first clears ``_ppspec_deferred`` so the other
        call does nothing (running it twice subtracts the correction twice).
        """

        def run() -> None:
            if self._ppspec_deferred is not run:
                return  # already ran this step, or belongs to an earlier step
            self._ppspec_deferred = None
            correction()

        return run

    def execute_model(
        self,
        scheduler_output: SchedulerOutput,
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> Any:
        clocks = self.ppspec_clocks
        if scheduler_output.total_num_scheduled_tokens > 0:
            clocks.steps += 1
        with clocks.timing("total_step_s"):
            return self._ppspec_execute_model(scheduler_output, intermediate_tensors)

    def _ppspec_execute_model(
        self,
        scheduler_output: SchedulerOutput,
        intermediate_tensors: IntermediateTensors | None,
    ) -> Any:
        lanes = self._ppspec_lanes
        if lanes is not None:
            lanes.prepare(self, scheduler_output)
        if self._ppspec_mode is Mode.OFF or self._ppspec_is_last:
            return super().execute_model(  # type: ignore[misc]
                scheduler_output, intermediate_tensors
            )
        self._ppspec_deferred = None
        self._ppspec_fault_step += 1
        if self._ppspec_faults.fires("raise", self._ppspec_fault_step):
            raise faults.InjectedFault(f"raise@{self._ppspec_fault_step} on a non-last PP rank")
        output = super().execute_model(  # type: ignore[misc]
            scheduler_output, intermediate_tensors
        )
        if isinstance(output, IntermediateTensors):
            if self._ppspec_two_batch is not None:
                self._ppspec_two_batch.stash = scheduler_output
            if lanes is not None:
                lanes.rows = lanes.rows_of(self, scheduler_output)
            if intermediate_tensors is not None and eagle3.uses_aux_states(self.speculative_config):
                eagle3.relay(self.model, output, intermediate_tensors)  # type: ignore[attr-defined]
            # vLLM runs the async spec-decode count correction after the forward
            # on the last rank only (it returns before reaching it here); in the
            # mamba "align" mode it already ran it before the forward, and then
            # this call does nothing (_ppspec_run_once).
            if self._ppspec_deferred is not None:
                self._ppspec_deferred()
        self._ppspec_deferred = None
        return output

    def _update_states_after_model_execute(
        self, output_token_ids: torch.Tensor, scheduler_output: SchedulerOutput
    ) -> None:
        if self._ppspec_mode.exchanges_rounds and self._ppspec_is_last:
            self._ppspec_captured = output_token_ids
        super()._update_states_after_model_execute(  # type: ignore[misc]
            output_token_ids, scheduler_output
        )

    def _pp_broadcast_prev_sampled_token_ids(self, sampled_token_ids: torch.Tensor) -> None:
        if self.ppspec_active:
            return  # the rounds (or, in sync mode, the scheduler output) carry it
        super()._pp_broadcast_prev_sampled_token_ids(sampled_token_ids)  # type: ignore[misc]

    def sample_tokens(self, grammar_output: Any) -> Any:
        with self.ppspec_clocks.timing("total_step_s"):
            return self._ppspec_sample_tokens(grammar_output)

    def _ppspec_sample_tokens(self, grammar_output: Any) -> Any:
        mode = self._ppspec_mode
        if mode is Mode.OFF:
            return super().sample_tokens(grammar_output)  # type: ignore[misc]
        if mode is Mode.SYNC:
            output = super().sample_tokens(grammar_output)  # type: ignore[misc]
            if self._ppspec_is_last:
                attach_drafts(output, self.take_draft_token_ids())  # type: ignore[attr-defined]
            return output
        if self._ppspec_lanes is not None:
            vllm_sample = super().sample_tokens  # type: ignore[misc]
            return self._ppspec_lanes.sample(
                self,
                self._ppspec_fault_step,
                lambda: vllm_sample(grammar_output),
                lambda: self._ppspec_sample_capturing(grammar_output),
            )
        two_batch = self._ppspec_two_batch
        assert two_batch is not None
        if self._ppspec_is_last:
            return two_batch.sample_last(self, self._ppspec_sample_capturing(grammar_output))
        vllm_replay = super()._update_states_after_model_execute  # type: ignore[misc]
        return two_batch.sample_other(self, self._ppspec_fault_step, vllm_replay)

    def _ppspec_sample_capturing(self, grammar_output: Any) -> tuple[Any, torch.Tensor]:
        """Last rank: vLLM's sample_tokens, and the sampled tensor it produced.

        The tensor is captured where vLLM hands it to
        ``_update_states_after_model_execute``. If no sampler ran, the other
        ranks still wait for a round: they get 0 rows, which never matches a
        batch with requests, so every rank raises.
        """
        self._ppspec_captured = None
        output = super().sample_tokens(grammar_output)  # type: ignore[misc]
        sampled, self._ppspec_captured = self._ppspec_captured, None
        if sampled is None:
            sampled = torch.empty((0, 1), dtype=torch.int32)
        return output, sampled


class PPSpecGPUModelRunner(PPSpecRunnerMixin, GPUModelRunner):
    """vLLM's V1 GPUModelRunner with speculative decoding under PP."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ppspec_setup()


__all__ = ["PPSpecGPUModelRunner", "PPSpecRunnerMixin"]
