"""Override vLLM's V1 runner methods and call this rank's steps from each (the runner mixin).

Mixed into vLLM's ``GPUModelRunner`` (:class:`PPSpecGPUModelRunner`) and
``CPUModelRunner`` (:class:`vllm_ppspec.runner.cpu_runner.PPSpecCPUModelRunner`). The
mode is decided once (:mod:`vllm_ppspec.choice.policy`) and this rank's steps object
built once (:mod:`~vllm_ppspec.runner.steps.build`), in ``_ppspec_setup``, from the
config's plan (:mod:`vllm_ppspec.choice.plan`); every
per-step override calls that object's hooks (:mod:`~vllm_ppspec.runner.steps.base`)
with no condition, and holds no mode or rank of its own. ``OFF`` is a steps
object with no part. The parts are listed in ``runner/__init__.py``.

Every vLLM private name the package uses is listed in
:mod:`vllm_ppspec.compat.guard`. With the external launcher (torchrun, one
engine per rank) the mode is ``EXTERNAL`` (``steps/external.py``).

Collectives the plugin adds, on every rank of the PP group unless said:

* once at set-up, in this order, when the mode is not ``OFF``: the start-up
  check (``startup_check.agree``: a ``monitored_barrier``, an
  ``all_gather_object``), under the measured layer split an
  ``all_gather_object`` and a ``broadcast_object_list`` (``stage_speed.settle``),
  the round shape ``all_reduce`` (``LANES`` only,
  ``build.build_steps``), the placement check (``placement.pp_on_one_host``:
  an ``all_gather_object``), then the peer watch's ``all_gather_object``
  of listening addresses (``peer_watch.watch_pp_peers``);
* once after ``load_model``, mode not ``OFF``: the embedding hand-over's header
  ``all_reduce``, and if vLLM would share the target's embedding with the
  drafter a digest ``all_reduce`` and, if the drafter's values differ, a
  ``broadcast`` from the first rank (``embedding_handover``);
* per step, ``LANES``: one round message from the last rank to each other
  rank (``isend`` there, ``irecv`` on each receiver, gloo ``cpu_group``; see
  ``steps.lanes`` for who posts it when); ``EXTERNAL``: one ``broadcast``
  from the last rank per ``sample_tokens``, every rank (``steps.external``);
  none in ``SYNC``;
* at DP > 1 (MoE targets), per drafter run, on every rank holding a drafter,
  whatever the mode: one ``all_gather`` on the DP group's ``cpu_group`` before
  the drafter's first forward (:mod:`vllm_ppspec.protocol.dp_agreement`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vllm_ppspec.compat.guard import check_vllm

check_vllm()

# The imports below need a supported vLLM: the guard above runs first.
from vllm.distributed.parallel_state import get_pp_group  # noqa: E402
from vllm.logger import init_logger  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

from vllm_ppspec.choice import plan as plans  # noqa: E402
from vllm_ppspec.protocol import faults  # noqa: E402
from vllm_ppspec.runner import stage_speed  # noqa: E402
from vllm_ppspec.runner.clocks import Clocks  # noqa: E402
from vllm_ppspec.runner.drafter import dp_hook, eagle3, first_stage  # noqa: E402
from vllm_ppspec.runner.drafter.embedding_handover import give_drafter_the_target_embedding  # noqa: E402
from vllm_ppspec.runner.drafter.scope import isolate_drafter  # noqa: E402
from vllm_ppspec.runner.drafter.suffix_requests import SuffixRequests, for_drafter  # noqa: E402
from vllm_ppspec.runner.health.peer_watch import watch_pp_peers  # noqa: E402
from vllm_ppspec.runner.health.placement import peer_watch_host  # noqa: E402
from vllm_ppspec.runner.health.startup_check import agree, fingerprint  # noqa: E402
from vllm_ppspec.runner.steps.base import Steps, StepState  # noqa: E402
from vllm_ppspec.runner.steps.build import build_steps, check_engine_mode  # noqa: E402
from vllm_ppspec.runner.view import RunnerView  # noqa: E402

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

logger = init_logger("vllm.ppspec")


class PPSpecRunnerMixin:
    """Mixin for vLLM's V1 GPUModelRunner (and its CPU subclass)."""

    # Provided by GPUModelRunner.
    speculative_config: Any
    use_async_scheduling: bool
    num_spec_tokens: int
    broadcast_pp_output: bool

    # Class defaults: vLLM's own __init__ may reach an override before
    # _ppspec_setup runs; until then every override calls straight through.
    _ppspec_steps: Steps = Steps()
    _ppspec_step_count: int = 0  # execute_model calls on this rank
    _ppspec_state: StepState = StepState(-1, None)  # the step now between its hooks
    _ppspec_suffix: SuffixRequests | None = None  # the last rank's suffix drafter
    _ppspec_drafter_first = False  # the draft model runs on the first stage
    ppspec_plan: plans.Plan = plans.OFF  # the config's plan, read in _ppspec_setup

    @property
    def ppspec_clocks(self) -> Clocks:
        clocks = self.__dict__.get("_ppspec_clocks")
        if clocks is None:
            clocks = self.__dict__["_ppspec_clocks"] = Clocks()
        return clocks

    @property
    def _ppspec_view(self) -> RunnerView:
        view = self.__dict__.get("_ppspec_runner_view")
        if view is None:
            view = self.__dict__["_ppspec_runner_view"] = RunnerView(self)
        return view

    def _model_forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.ppspec_clocks.timing("forward_s"):
            return super()._model_forward(*args, **kwargs)  # type: ignore[misc]

    # ------------------------------------------------------------------
    # Set-up: the mode and its steps, once
    # ------------------------------------------------------------------
    def _ppspec_setup(self) -> None:
        """Called right after GPUModelRunner.__init__ (drafter already built)."""
        pp = get_pp_group()
        plan = self.ppspec_plan = plans.plan_of(self.vllm_config)  # type: ignore[attr-defined]
        mode = plan.mode
        is_last = pp.is_last_rank
        # DP > 1 (MoE targets): this rank's drafter agrees with the other DP
        # ranks' on each run (protocol/dp_agreement.py), in every mode.
        dp_hook.install_for_runner(self)
        if not plan.serves_pp:
            return
        check_engine_mode(self.vllm_config, mode)  # type: ignore[attr-defined]
        # The draft model on the first stage (sync mode): the plan's decision,
        # compared across ranks with the rest of the fingerprint.
        first = first_stage.set_up(self, pp)
        self._ppspec_drafter_first = first is not False
        # The plugin's first collective: every PP rank was started the same way
        # (one host or several), or every rank refuses (health/startup_check.py).
        agree(pp.cpu_group, fingerprint(self, plan))
        if stage_speed.applies(self.vllm_config):  # type: ignore[attr-defined]
            # The measured layer split: a gather and a broadcast (stage_speed.py).
            stage_speed.settle(self.vllm_config, pp, self.device)  # type: ignore[attr-defined]
        RunnerView.check(self)
        fault = faults.Faults.from_env()
        if fault.any():
            logger.warning("vllm-ppspec: test fault injection on non-last ranks: %s", fault)
        self._ppspec_steps = build_steps(
            mode,
            pp,
            hybrid=bool(self.model_config.is_hybrid),  # type: ignore[attr-defined]
            eagle3_relay=eagle3.uses_aux_states(self.speculative_config),
            capacity=self.max_num_reqs,  # type: ignore[attr-defined]
            k=self.num_spec_tokens,
            fault=fault,
            clocks=self.ppspec_clocks,
            view=self._ppspec_view,
            drafter_first=self._ppspec_drafter_first,
            catch_up=first if isinstance(first, first_stage.DraftCatchUp) else None,
            tp=self.parallel_config.tensor_parallel_size,  # type: ignore[attr-defined]
        )
        if is_last and not self._ppspec_drafter_first:
            isolate_drafter(self.drafter)  # type: ignore[attr-defined]
            self._ppspec_suffix = for_drafter(
                self.drafter,  # type: ignore[attr-defined]
                self.speculative_config.method,
            )
        # Every PP rank, once, here, in this order on the PP gloo group: the
        # placement check (health/placement.py), then the peer watch's address
        # exchange. A dead peer ends this worker (health/peer_watch.py), over the
        # loopback when the ranks share this host, else on this node's address.
        if plan.watches_peers:
            watch_pp_peers(pp.cpu_group, peer_watch_host(pp.cpu_group))
        logger.info(
            "vllm-ppspec: PP rank %d/%d, speculative method %s, k=%d, %s scheduling",
            pp.rank_in_group,
            pp.world_size,
            self.speculative_config.method,
            self.num_spec_tokens,
            mode.value,
        )

    # ------------------------------------------------------------------
    # Non-last ranks have no drafter: hide it from vLLM's set-up and metadata
    # paths (the steps' drafter scope; OFF and the last rank show it).
    # ------------------------------------------------------------------
    def _dummy_run(self, *args: Any, **kwargs: Any) -> Any:
        # A dummy batch writes nothing into the drafter's KV cache (dp_hook.py).
        dp_hook.clear_dummy_slots(getattr(self, "drafter", None))
        with self._ppspec_steps.drafter_scope(self):
            return super()._dummy_run(*args, **kwargs)  # type: ignore[misc]

    def _build_attention_metadata(self, *args: Any, **kwargs: Any) -> Any:
        with self._ppspec_steps.drafter_scope(self):
            return super()._build_attention_metadata(*args, **kwargs)  # type: ignore[misc]

    def initialize_metadata_builders(self, *args: Any, **kwargs: Any) -> Any:
        with self._ppspec_steps.drafter_scope(self):
            return super().initialize_metadata_builders(*args, **kwargs)  # type: ignore[misc]

    def _check_and_update_cudagraph_mode(self, *args: Any, **kwargs: Any) -> Any:
        with self._ppspec_steps.drafter_scope(self):
            return super()._check_and_update_cudagraph_mode(  # type: ignore[misc]
                *args, **kwargs
            )

    def initialize_kv_cache(self, *args: Any, **kwargs: Any) -> Any:
        with self._ppspec_steps.drafter_scope(self):
            return super().initialize_kv_cache(*args, **kwargs)  # type: ignore[misc]

    # ------------------------------------------------------------------
    # Load time: the target's embedding for the drafter; EAGLE-3 states.
    # ------------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> Any:
        pp = get_pp_group()
        # With the draft model on the first stage the last rank's stays unloaded.
        unloaded = self._ppspec_drafter_first and pp.is_last_rank
        with first_stage.drafter_unloaded(self, unloaded):
            result = super().load_model(*args, **kwargs)  # type: ignore[misc]
        if self.ppspec_plan.serves_pp:
            give_drafter_the_target_embedding(self, pp, pp.is_last_rank and not unloaded)
        return result

    def _setup_eagle3_aux_hidden_state_outputs(self) -> None:
        vllm_setup = super()._setup_eagle3_aux_hidden_state_outputs  # type: ignore[misc]
        if not self.ppspec_plan.serves_pp or not eagle3.uses_aux_states(self.speculative_config):
            vllm_setup()
            return
        model = self.model  # type: ignore[attr-defined]
        eagle3.set_up(model, self.speculative_config, get_pp_group().is_last_rank, vllm_setup)

    # ------------------------------------------------------------------
    # Every step: this rank's hooks (steps/base.py), with no condition
    # ------------------------------------------------------------------
    def _update_states(self, scheduler_output: SchedulerOutput) -> Any:
        steps, view = self._ppspec_steps, self._ppspec_view
        if self._ppspec_suffix is not None:
            self._ppspec_suffix.finished(scheduler_output.finished_req_ids)
        steps.before_update(view, scheduler_output)
        deferred = super()._update_states(scheduler_output)  # type: ignore[misc]
        steps.after_update(view, scheduler_output)
        return deferred

    def execute_model(
        self, scheduler_output: SchedulerOutput, intermediate_tensors: Any = None
    ) -> Any:
        clocks, steps, view = self.ppspec_clocks, self._ppspec_steps, self._ppspec_view
        if scheduler_output.total_num_scheduled_tokens > 0:
            clocks.steps += 1
        state = StepState(self._ppspec_step_count, scheduler_output, received=intermediate_tensors)
        self._ppspec_state = state
        self._ppspec_step_count += 1
        with clocks.timing("total_step_s"):
            steps.before_execute(view, state)
            output = super().execute_model(  # type: ignore[misc]
                scheduler_output, intermediate_tensors
            )
            steps.after_forward(view, state, output, intermediate_tensors)
        return output

    def _update_states_after_model_execute(
        self, output_token_ids: torch.Tensor, scheduler_output: SchedulerOutput
    ) -> None:
        self._ppspec_steps.sampled_tensor(output_token_ids)
        super()._update_states_after_model_execute(  # type: ignore[misc]
            output_token_ids, scheduler_output
        )

    def propose_draft_token_ids(self, *args: Any, **kwargs: Any) -> Any:
        vllm_propose = super().propose_draft_token_ids  # type: ignore[misc]
        with self.ppspec_clocks.timing("draft_s"):
            if self._ppspec_suffix is None:
                return vllm_propose(*args, **kwargs)
            with self._ppspec_suffix.proposing():
                return vllm_propose(*args, **kwargs)

    def _pp_broadcast_prev_sampled_token_ids(self, sampled_token_ids: torch.Tensor) -> None:
        vllm_broadcast = super()._pp_broadcast_prev_sampled_token_ids  # type: ignore[misc]
        self._ppspec_steps.pp_broadcast(vllm_broadcast, sampled_token_ids)

    def sample_tokens(self, grammar_output: Any) -> Any:
        steps, view, state = self._ppspec_steps, self._ppspec_view, self._ppspec_state
        with self.ppspec_clocks.timing("total_step_s"):
            steps.before_sample(view, state)
            with steps.sampling(self):
                output = super().sample_tokens(grammar_output)  # type: ignore[misc]
            steps.after_sample(view, state, output)
        return output

    def _sample(self, logits: Any, spec_decode_metadata: Any) -> Any:
        vllm_sample = super()._sample  # type: ignore[misc]
        return self._ppspec_steps.sample(vllm_sample, logits, spec_decode_metadata)

    def ppspec_shutdown(self) -> None:
        """The worker shuts down: the mode's steps end theirs."""
        self._ppspec_steps.shutdown()


class PPSpecGPUModelRunner(PPSpecRunnerMixin, GPUModelRunner):
    """vLLM's V1 GPUModelRunner with speculative decoding under PP."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ppspec_setup()


__all__ = ["PPSpecGPUModelRunner", "PPSpecRunnerMixin"]
