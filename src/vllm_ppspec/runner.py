"""The runner mixin: speculative decoding under pipeline parallelism.

Most of the code that touches vLLM's V1 runner internals is here; the rest is
in :mod:`vllm_ppspec.lane_runner` (async lanes, mixed in here),
:mod:`vllm_ppspec.cpu_runner` (the CPU runner's receive buffer),
:mod:`vllm_ppspec.drafter_scope` (the drafter's PP view) and
:mod:`vllm_ppspec.embedding_share` (the drafter's embedding decision). Every vLLM
private name the package uses is listed in :mod:`vllm_ppspec.version_guard`. The
mixin is mixed into vLLM's ``GPUModelRunner`` (:class:`PPSpecGPUModelRunner`) and
``CPUModelRunner`` (:class:`vllm_ppspec.cpu_runner.PPSpecCPUModelRunner`).

With PP = 1 or without a speculative config every override calls straight
through to vLLM (``_model_forward`` only times the forward), except that at
DP > 1 ``_ppspec_setup`` still installs the DP agreement on the drafter (below). PP + spec with the
external-launcher (torchrun) PP mode is refused: by the config check
(:mod:`vllm_ppspec.config_patches`) and again in ``_ppspec_setup``.

Sync scheduling (PP batches in flight; docs/design.md): the scheduler output
carries every token a rank needs. The last rank attaches each batch's drafts
to its output (:mod:`vllm_ppspec.draft_delivery`); non-last ranks rebuild the
token list of a request that re-joins the batch; every rank rebuilds hybrid
accepted counts by request (:mod:`vllm_ppspec.accepted_counts`).

Async scheduling with lanes (the default; :mod:`vllm_ppspec.lanes`): the
runner runs vLLM's sync path. Every rank makes each step sync-shaped from the
rounds it holds by request; the last rank records and posts each round
without waiting; the others receive it PP - r steps later (the collective
order is set out above ``_ppspec_lane_prepare``).

Async scheduling without lanes (``VLLM_PPSPEC_ASYNC_LANES=0``), per
speculative round (one ``execute_model`` + ``sample_tokens`` pair):

* last rank: vLLM samples and drafts as usual. The sampled tensor is captured
  where vLLM hands it to ``_update_states_after_model_execute``; vLLM's own
  ``[num_reqs, 1]`` broadcast on the device group is suppressed. At the end of
  ``sample_tokens`` the round goes out through :meth:`transport.RoundChannel.send`.
* other ranks: ``execute_model`` stashes the ``scheduler_output`` when it returns
  intermediate tensors; ``sample_tokens`` receives the round
  (:meth:`transport.RoundChannel.recv`) and then replays what the sampler's rank did:
  ``_update_states_after_model_execute`` (hybrid models: accepted counts for the
  recurrent-state shift), the next-token/valid-count hand-off
  (``_copy_valid_sampled_token_count``), the placeholder bookkeeping vLLM does
  for the last rank, and the draft tensor that the next step scatters into its
  input ids.

Collectives added, once at set-up under PP + spec on every rank of the PP
group: the peer watcher's ``all_gather_object`` of process ids
(rank_errors.watch_pp_peers). Once after ``load_model`` on every rank of the
PP group: header ``all_reduce``; if vLLM would share the target's embedding with the
drafter (embedding_share.share_mode), a digest ``all_reduce`` and, if the
drafter's values differ, a ``broadcast`` of the target's embedding from the
first rank (embedding_handover.hand_over_embedding).

Collectives added under async scheduling, per ``sample_tokens`` call, on every
rank of the PP group: one ``all_reduce`` carrying header, sampled matrix and
drafts (on ``pp.cpu_group``, preceded once, at set-up on every PP rank, by a
shape ``all_reduce``: ``RoundChannel.agree_shape``; see
:mod:`vllm_ppspec.transport`). The last rank calls it after
its sampler and drafter ran (with lanes: posted, completed PP steps later); the
others before returning (with lanes: at the start of a later ``execute_model``).
A rank whose round cannot be applied raises only after it completed. Under sync
scheduling none are added.

At DP > 1 (MoE targets), per drafter run, on every rank holding a drafter:
one ``all_gather`` on the DP group's ``cpu_group`` before the drafter's first
forward (:mod:`vllm_ppspec.dp_agreement`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from vllm_ppspec.version_guard import check_vllm

check_vllm()

from vllm.distributed.parallel_state import get_dp_group, get_pp_group  # noqa: E402
from vllm.logger import init_logger  # noqa: E402
from vllm.sequence import IntermediateTensors  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer  # noqa: E402
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (  # noqa: E402
    aux_hidden_state_relay_keys,
    reserve_aux_intermediate_tensor_slots,
    set_eagle3_aux_hidden_state_layers,
    verify_supports_aux_hidden_states_over_pp,
)
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

from vllm_ppspec import dp_agreement, faults  # noqa: E402
from vllm_ppspec.accepted_counts import AcceptedCounts  # noqa: E402
from vllm_ppspec.accounting import next_tokens_and_counts  # noqa: E402
from vllm_ppspec.draft_delivery import attach_drafts  # noqa: E402
from vllm_ppspec.drafter_scope import isolate_drafter  # noqa: E402
from vllm_ppspec.embedding_handover import embedding_digest, hand_over_embedding  # noqa: E402
from vllm_ppspec.embedding_share import (  # noqa: E402
    ShareMode,
    drafter_embedding,
    share_mode,
)
from vllm_ppspec.lane_runner import (  # noqa: E402
    LaneStepsMixin,
    MissingStashError,
    lane_scheduler_selected,
)
from vllm_ppspec.rank_errors import watch_pp_peers  # noqa: E402
from vllm_ppspec.transport import Round, RoundChannel  # noqa: E402

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

logger = init_logger("vllm.ppspec")

FAULT_SKIP_STATE_REPLAY = faults.SKIP_STATE_REPLAY  # test fault injection (faults.py)


class DrafterlessSpecConfig:
    """The speculative config as a rank without a drafter must see it.

    It is falsy, so vLLM's ``if self.speculative_config and ...`` blocks that
    reach for ``self.drafter`` are skipped, yet ``is not None`` still holds, so
    paths that only ask "is spec decoding on" (attention metadata for spec
    decoding, buffer sizes) behave as on the last rank. Attributes come from
    the real config.
    """

    def __init__(self, real: Any) -> None:
        self._real = real

    def __bool__(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def require_aux_hidden_states_over_pp(model: Any) -> None:
    """Refuse EAGLE-3 under PP for a target that cannot ship its auxiliary states.

    vLLM's V2 runner makes the same check (``verify_supports_aux_hidden_states_over_pp``);
    without it the later helpers return silently and the drafter gets no states.
    """
    try:
        verify_supports_aux_hidden_states_over_pp(model, "eagle3")
    except ValueError as e:
        raise ValueError(
            f"vllm-ppspec: {e}: the target's decoder does not pass EAGLE-3 auxiliary "
            "hidden states between PP stages (vLLM's supports_aux_hidden_states_over_pp: "
            "Llama, Qwen2 and models built on them). Use --pipeline-parallel-size 1 "
            "for EAGLE-3 with this model, or another method (eagle, draft_model, ngram, mtp)."
        ) from e


class PPSpecRunnerMixin(LaneStepsMixin):
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
    _ppspec_active: bool = False  # speculative decoding under PP on this runner
    _ppspec_rounds: bool = False  # ... and async scheduling, two batches: rounds over transport
    _ppspec_lanes: bool = False  # ... and async scheduling with lanes (lanes.py)
    _ppspec_counts: AcceptedCounts | None = None  # sync + hybrid: accepted counts
    _ppspec_skip_state_replay: bool = False  # test fault injection (read at set-up)
    _ppspec_faults: faults.Faults = faults.Faults()
    _ppspec_step: int = 0  # non-last ranks: execute_model calls (for fault injection)

    # Seconds spent in the target model's forward on this rank: the
    # benchmark's busy fraction (vLLM's workers spin while they wait, so CPU
    # time cannot tell). Read with vllm_ppspec.testing.probes.runner_clocks.
    ppspec_forward_s: float = 0.0
    # Seconds inside execute_model and sample_tokens (the forward included),
    # less the async round's collective (waiting for the last rank): the rest
    # of the wall time this rank waited for work.
    ppspec_step_s: float = 0.0
    # execute_model calls with tokens to compute: the benchmark divides the
    # clocks by it for milliseconds per step.
    ppspec_steps: int = 0

    def _model_forward(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return super()._model_forward(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.ppspec_forward_s += time.perf_counter() - start

    def _ppspec_setup(self) -> None:
        """Called right after GPUModelRunner.__init__ (drafter already built)."""
        pp = get_pp_group()
        self._ppspec_active = bool(self.speculative_config) and pp.world_size > 1
        self._ppspec_lanes = (
            self._ppspec_active and self.use_async_scheduling and lane_scheduler_selected(self)
        )
        if self._ppspec_lanes:
            # Each step reaches vLLM's runner as sync scheduling would send it
            # (lanes.py), so its sync path runs; rounds still travel from the
            # last rank, one per step, completed PP steps later.
            self.use_async_scheduling = False
            self.use_async_spec_decode = False  # type: ignore[attr-defined]
        # Async scheduling: each round travels from the last rank (transport).
        # Sync scheduling: the scheduler output carries all a rank needs, so
        # stages never wait for each other and batches fill the pipeline.
        self._ppspec_rounds = self._ppspec_active and self.use_async_scheduling
        self._ppspec_counts = (
            AcceptedCounts()
            if self._ppspec_active and not self.use_async_scheduling and self.model_config.is_hybrid  # type: ignore[attr-defined]
            else None
        )
        self._ppspec_is_last = pp.is_last_rank
        self._ppspec_stash: SchedulerOutput | None = None
        self._ppspec_round_sampled: torch.Tensor | None = None
        self._ppspec_deferred: Callable[[], None] | None = None
        # DP > 1 (MoE targets): this rank's drafter agrees with the other DP
        # ranks' on each run (dp_agreement.py), with PP or without.
        self._ppspec_install_dp_agreement()
        if not self._ppspec_active:
            return
        if self.broadcast_pp_output:
            raise ValueError(
                "vllm-ppspec does not support speculative decoding with the "
                "external_launcher (torchrun) PP mode; use the default mp executor "
                "(--distributed-executor-backend mp) or remove --speculative-config."
            )
        self._ppspec_lane_setup()
        if self._ppspec_rounds or self._ppspec_lanes:
            # One all-reduce per round, of a static size (transport.py).
            self._ppspec_channel = RoundChannel(
                pp.cpu_group,
                pp.last_rank,
                self.max_num_reqs,  # type: ignore[attr-defined]
                self.num_spec_tokens,
            )
            # Every PP rank, here, in start-up order: after it, posting a round
            # never blocks (transport.RoundChannel.agree_shape).
            self._ppspec_channel.agree_shape()
        if self._ppspec_is_last:
            isolate_drafter(self.drafter)  # type: ignore[attr-defined]
        # Every PP rank, once, here: a dead peer ends this worker (rank_errors.py).
        watch_pp_peers(pp.cpu_group)
        self._ppspec_faults = faults.Faults.from_env()
        self._ppspec_skip_state_replay = self._ppspec_faults.skip_state_replay
        if self._ppspec_faults.any():
            logger.warning(
                "vllm-ppspec: test fault injection on non-last ranks: %s", self._ppspec_faults
            )
        logger.info(
            "vllm-ppspec: PP rank %d/%d, speculative method %s, k=%d, %s scheduling",
            pp.rank_in_group,
            pp.world_size,
            self.speculative_config.method,
            self.num_spec_tokens,
            "async with lanes"
            if self._ppspec_lanes
            else "async"
            if self.use_async_scheduling
            else "sync",
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
    # Non-last ranks: no drafter. Hide it from vLLM's set-up and metadata paths.
    # ------------------------------------------------------------------
    @contextmanager
    def _ppspec_without_drafter(self) -> Iterator[None]:
        saved = self.speculative_config
        if (
            not self._ppspec_active
            or self._ppspec_is_last
            or isinstance(saved, DrafterlessSpecConfig)
        ):
            yield
            return
        self.speculative_config = DrafterlessSpecConfig(saved)
        try:
            yield
        finally:
            self.speculative_config = saved

    def _dummy_run(self, *args: Any, **kwargs: Any) -> Any:
        with self._ppspec_without_drafter():
            return super()._dummy_run(*args, **kwargs)  # type: ignore[misc]

    def _build_attention_metadata(self, *args: Any, **kwargs: Any) -> Any:
        with self._ppspec_without_drafter():
            return super()._build_attention_metadata(*args, **kwargs)  # type: ignore[misc]

    def initialize_metadata_builders(self, *args: Any, **kwargs: Any) -> Any:
        with self._ppspec_without_drafter():
            return super().initialize_metadata_builders(*args, **kwargs)  # type: ignore[misc]

    def _check_and_update_cudagraph_mode(self, *args: Any, **kwargs: Any) -> Any:
        with self._ppspec_without_drafter():
            return super()._check_and_update_cudagraph_mode(  # type: ignore[misc]
                *args, **kwargs
            )

    def initialize_kv_cache(self, *args: Any, **kwargs: Any) -> Any:
        with self._ppspec_without_drafter():
            return super().initialize_kv_cache(*args, **kwargs)  # type: ignore[misc]

    # ------------------------------------------------------------------
    # Load time: a drafter without its own embedding gets the target's.
    # ------------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> Any:
        result = super().load_model(*args, **kwargs)  # type: ignore[misc]
        if self._ppspec_active:
            self._ppspec_hand_over_embedding()
        return result

    def _ppspec_hand_over_embedding(self) -> None:
        """Give the last rank's drafter the target's token embedding where vLLM would.

        At PP = 1 vLLM shares the target's embedding with some drafters; under
        PP it skips that and the embedding lives on the first stage. The last
        rank replays vLLM's decision (embedding_share.share_mode: EAGLE/MTP
        heads, never a draft model) and the first rank sends the weights if the
        drafter does not hold them already. Every PP rank calls this once,
        after vLLM's own load (see embedding_handover.hand_over_embedding).
        """
        pp = get_pp_group()
        mode = ShareMode.NONE
        want_shape = None
        drafter_embed = None
        if self._ppspec_is_last:
            drafter = getattr(self, "drafter", None)
            mode = share_mode(drafter)
            drafter_embed = drafter_embedding(drafter)
            weight = getattr(drafter_embed, "weight", None)
            if mode != ShareMode.NONE:
                if mode != ShareMode.UNSUPPORTED and isinstance(weight, torch.Tensor):
                    want_shape = (int(weight.shape[0]), int(weight.shape[1]))
                else:  # includes a drafter without an embedding module to copy into
                    mode, want_shape = ShareMode.UNSUPPORTED, (0, 0)
        target_weight = None
        if pp.is_first_rank:
            model = self.model  # type: ignore[attr-defined]
            language_model = (
                model.get_language_model() if hasattr(model, "get_language_model") else model
            )
            inner = getattr(language_model, "model", None)
            embed = getattr(inner, "embed_tokens", None) or getattr(inner, "embedding", None)
            target_weight = getattr(embed, "weight", None)
        weight = hand_over_embedding(
            pp.cpu_group,
            pp.first_rank,
            target_weight,
            want_shape,
            mode=int(mode),
            want_digest=lambda: embedding_digest(drafter_embed.weight),  # type: ignore[union-attr]
        )
        if weight is not None and drafter_embed is not None:
            with torch.no_grad():
                drafter_embed.weight.copy_(weight.to(drafter_embed.weight.dtype))
            logger.info(
                "vllm-ppspec: drafter uses the target's token embedding from PP rank 0 %s",
                tuple(weight.shape),
            )

    # ------------------------------------------------------------------
    # EAGLE-3 auxiliary hidden states cross PP stages in intermediate tensors.
    # ------------------------------------------------------------------
    def _ppspec_uses_eagle3_aux(self) -> bool:
        spec = self.speculative_config
        if not spec or spec.method != "eagle3" or spec.draft_model_config is None:
            return False
        eagle_config = getattr(spec.draft_model_config.hf_config, "eagle_config", None) or {}
        return bool(eagle_config.get("use_aux_hidden_state", True))

    def _setup_eagle3_aux_hidden_state_outputs(self) -> None:
        if not self._ppspec_active or not self._ppspec_uses_eagle3_aux():
            super()._setup_eagle3_aux_hidden_state_outputs()  # type: ignore[misc]
            return
        model = self.model  # type: ignore[attr-defined]
        require_aux_hidden_states_over_pp(model)  # same model class: every rank raises
        if self._ppspec_is_last:
            # vLLM sets the layers; the receive buffer also needs the slots of
            # the auxiliary states computed on earlier stages.
            super()._setup_eagle3_aux_hidden_state_outputs()  # type: ignore[misc]
            reserve_aux_intermediate_tensor_slots(model)
        else:
            # Earlier stages compute some of the auxiliary layers and ship them
            # in their intermediate tensors; the runner itself still returns
            # plain intermediate tensors (use_aux_hidden_state_outputs stays off).
            set_eagle3_aux_hidden_state_layers(model, self.speculative_config)

    # ------------------------------------------------------------------
    # Every step
    # ------------------------------------------------------------------
    def _update_states(self, scheduler_output: SchedulerOutput) -> Any:
        if self._ppspec_active and not self._ppspec_rounds and not self._ppspec_is_last:
            self._ppspec_restore_output_tokens(scheduler_output)
        deferred = super()._update_states(scheduler_output)  # type: ignore[misc]
        if deferred is not None and self._ppspec_active and not self._ppspec_is_last:
            deferred = self._ppspec_run_once(deferred)
        self._ppspec_deferred = deferred
        if self._ppspec_rounds and not self._ppspec_is_last:
            self._ppspec_trim_optimistic_outputs(scheduler_output)
        if self._ppspec_counts is not None:
            self._ppspec_restore_accepted_counts(scheduler_output)
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

    def _ppspec_restore_output_tokens(self, scheduler_output: SchedulerOutput) -> None:
        """Sync scheduling, non-last ranks: a re-joining request's full token list.

        With speculative decoding the scheduler sends a non-last rank only the
        last sampled token of each round, not the accepted drafts before it;
        vLLM's ``_update_states`` then leaves the cached request shorter than
        its computed tokens. That is harmless while the request stays in the
        persistent batch (its earlier positions are computed), but a request
        that left the batch is re-added from that short list and its next
        input ids are read past its end. The scheduler sends ``all_token_ids``
        for exactly those requests (not scheduled in the previous step); take
        the tokens up to the computed ones from it, as vLLM itself does for
        resumed requests under async scheduling.
        """
        cached = scheduler_output.scheduled_cached_reqs
        all_token_ids = cached.all_token_ids
        if not all_token_ids:
            return
        for i, req_id in enumerate(cached.req_ids):
            tokens = all_token_ids.get(req_id)
            req_state = self.requests.get(req_id)
            if tokens is None or req_state is None:
                continue
            num_computed = cached.num_computed_tokens[i]
            if num_computed >= req_state.num_prompt_tokens:
                req_state.output_token_ids[:] = tokens[req_state.num_prompt_tokens : num_computed]

    def _ppspec_restore_accepted_counts(self, scheduler_output: SchedulerOutput) -> None:
        """Sync scheduling, hybrid models: each row's count of its request's last round.

        Runs on every rank after ``_update_states`` (the batch now holds this
        step's rows; re-added requests were reset to 1) and before
        ``_prepare_inputs`` reads the counts. See :mod:`accepted_counts`.
        """
        counts = self._ppspec_counts
        assert counts is not None
        for req_id in scheduler_output.finished_req_ids:
            counts.forget(req_id)
        event = getattr(self, "num_accepted_tokens_event", None)
        if event is not None:
            event.synchronize()  # the sampler's own D2H copy must not land later
        batch = self.input_batch
        skip_replay = not self._ppspec_is_last and self._ppspec_skip_state_replay
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id in cached.resumed_req_ids:
                counts.forget(req_id)  # recomputed from its prompt: count 1
                continue
            valid = counts.valid_tokens(req_id, cached.num_computed_tokens[i])
            row = batch.req_id_to_index.get(req_id)
            if valid is not None and row is not None and not skip_replay:
                batch.num_accepted_tokens_cpu[row] = valid
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        for req_id, num in scheduler_output.num_scheduled_tokens.items():
            state = self.requests.get(req_id)
            if state is not None:
                counts.record(
                    req_id, state.num_computed_tokens, num, len(spec_tokens.get(req_id, ()))
                )

    def _ppspec_trim_optimistic_outputs(self, scheduler_output: SchedulerOutput) -> None:
        """Drop the optimistic placeholders of rejected drafts, as the last rank does.

        Under async scheduling vLLM extends each request's output by the number
        of drafts it scheduled, assuming all are accepted, and on the last rank
        cuts it back to the scheduler's ``num_output_tokens``. That cut is in the
        last-rank branch only; without it a non-last rank's ``num_tokens``
        grows with every rejected draft, and ``_prepare_inputs`` then marks
        decoding requests as partial prefills, feeding them stale token ids.
        Mirrors the last-rank cut in ``GPUModelRunner._update_states``
        (vllm/v1/worker/gpu_model_runner.py; hash pinned in
        version_guard.MIRRORED_FUNCTIONS).
        """
        req_data = scheduler_output.scheduled_cached_reqs
        batch = self.input_batch
        for i, req_id in enumerate(req_data.req_ids):
            req_state = self.requests.get(req_id)
            num_output_tokens = req_data.num_output_tokens[i]
            if req_state is None or num_output_tokens >= len(req_state.output_token_ids):
                continue
            del req_state.output_token_ids[num_output_tokens:]
            req_index = batch.req_id_to_index.get(req_id)
            if req_index is not None:
                batch.num_tokens_no_spec[req_index] = (
                    batch.num_prompt_tokens[req_index] + num_output_tokens
                )

    def execute_model(
        self,
        scheduler_output: SchedulerOutput,
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> Any:
        start = time.perf_counter()
        if scheduler_output.total_num_scheduled_tokens > 0:
            self.ppspec_steps += 1
        try:
            return self._ppspec_execute_model(scheduler_output, intermediate_tensors)
        finally:
            self.ppspec_step_s += time.perf_counter() - start

    def _ppspec_execute_model(
        self,
        scheduler_output: SchedulerOutput,
        intermediate_tensors: IntermediateTensors | None,
    ) -> Any:
        if self._ppspec_lanes:
            self._ppspec_lane_prepare(scheduler_output)
        if not self._ppspec_active or self._ppspec_is_last:
            return super().execute_model(  # type: ignore[misc]
                scheduler_output, intermediate_tensors
            )
        self._ppspec_deferred = None
        self._ppspec_step += 1
        if self._ppspec_faults.fires("raise", self._ppspec_step):
            raise faults.InjectedFault(f"raise@{self._ppspec_step} on a non-last PP rank")
        output = super().execute_model(  # type: ignore[misc]
            scheduler_output, intermediate_tensors
        )
        if isinstance(output, IntermediateTensors):
            if self._ppspec_rounds:
                self._ppspec_stash = scheduler_output
            if self._ppspec_lanes:
                self._ppspec_lane_rows = self._ppspec_rows(scheduler_output)
            if intermediate_tensors is not None and self._ppspec_uses_eagle3_aux():
                # A middle stage passes on the auxiliary states of the stages
                # before it (vLLM's model only packs its own layers' states).
                for key in aux_hidden_state_relay_keys(self.model):  # type: ignore[attr-defined]
                    output.tensors[key] = intermediate_tensors[key]
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
        if (self._ppspec_rounds or self._ppspec_lanes) and self._ppspec_is_last:
            self._ppspec_round_sampled = output_token_ids
        super()._update_states_after_model_execute(  # type: ignore[misc]
            output_token_ids, scheduler_output
        )

    def _pp_broadcast_prev_sampled_token_ids(self, sampled_token_ids: torch.Tensor) -> None:
        if self._ppspec_active:
            # Replaced by the round transport at the end of sample_tokens.
            return
        super()._pp_broadcast_prev_sampled_token_ids(sampled_token_ids)  # type: ignore[misc]

    def sample_tokens(self, grammar_output: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._ppspec_sample_tokens(grammar_output)
        finally:
            self.ppspec_step_s += time.perf_counter() - start

    def _ppspec_sample_tokens(self, grammar_output: Any) -> Any:
        if not self._ppspec_active:
            return super().sample_tokens(grammar_output)  # type: ignore[misc]
        if self._ppspec_lanes:
            return self._ppspec_lane_sample(grammar_output)
        if not self._ppspec_rounds:
            output = super().sample_tokens(grammar_output)  # type: ignore[misc]
            if self._ppspec_is_last:
                attach_drafts(output, self.take_draft_token_ids())  # type: ignore[attr-defined]
            return output
        if self._ppspec_is_last:
            output, sampled = self._ppspec_sample_capturing(grammar_output)
            start = time.perf_counter()
            self._ppspec_channel.send(
                self.input_batch.num_reqs,
                sampled,
                self._draft_token_ids,  # type: ignore[attr-defined]
            )
            self.ppspec_step_s -= time.perf_counter() - start
            return output

        # Non-last ranks. Mirrors the non-last branch of
        # GPUModelRunner.sample_tokens (vllm/v1/worker/gpu_model_runner.py; hash
        # pinned in version_guard.MIRRORED_FUNCTIONS): pass the KV connector
        # output through and receive what the last rank sampled; here the round
        # replaces _pp_receive_prev_sampled_token_ids_to_input_batch.
        kv_connector_output = self.kv_connector_output  # type: ignore[has-type]
        self.kv_connector_output = None
        stash, self._ppspec_stash = self._ppspec_stash, None
        if self._ppspec_faults.fires("drop_stash", self._ppspec_step):
            stash = None
        start = time.perf_counter()
        rnd = self._ppspec_channel.recv(self.input_batch.num_reqs)
        self.ppspec_step_s -= time.perf_counter() - start
        # Raise only now, with the round consumed, so the last rank is not left
        # waiting in a collective.
        if stash is None:
            raise MissingStashError(
                f"PP rank {get_pp_group().rank_in_group}: sample_tokens was called without a "
                "scheduler_output stashed by execute_model; cannot replay the "
                "speculative round's state update on this rank."
            )
        self._ppspec_apply_round(rnd, stash)
        return ModelRunnerOutput.with_kv_conn_output_only(kv_connector_output)

    # ------------------------------------------------------------------
    # Non-last ranks: apply the round the last rank sampled.
    # ------------------------------------------------------------------
    def _ppspec_apply_round(self, rnd: Round, scheduler_output: SchedulerOutput) -> None:
        if self._ppspec_faults.fires("raise_in_round", self._ppspec_step):
            raise faults.InjectedFault(f"raise_in_round@{self._ppspec_step} on a non-last rank")
        num_reqs = self.input_batch.num_reqs
        sampled = rnd.sampled.to(self.device)
        # Hybrid models: the same accepted counts the sampler's rank applies to
        # its recurrent state (vLLM returns early for other models). The
        # environment switch exists only so that a test can prove that skipping
        # this breaks hybrid models.
        if not self._ppspec_skip_state_replay:
            super()._update_states_after_model_execute(  # type: ignore[misc]
                sampled, scheduler_output
            )
        discard = self.discard_request_mask.gpu[:num_reqs]  # type: ignore[attr-defined]
        next_ids, counts = next_tokens_and_counts(
            sampled, discard=discard, vocab_size=self.input_batch.vocab_size
        )
        self._ppspec_record_placeholders(num_reqs)
        self._copy_valid_sampled_token_count(next_ids, counts)  # type: ignore[attr-defined]
        self._draft_token_ids = rnd.drafts.to(self.device)
        self.prev_num_spec_tokens = self.num_spec_tokens

    def _ppspec_record_placeholders(self, num_reqs: int) -> None:
        """The async bookkeeping vLLM does on the sampler's rank.

        Each request whose sample is kept gets one ``-1`` placeholder output
        token and one more token slot; the next step's input ids for it come
        from ``prev_sampled_token_ids`` on the device. Discarded requests
        (partial prefills) keep their CPU token ids. Mirrors
        ``GPUModelRunner._pp_receive_prev_sampled_token_ids_to_input_batch``
        (vllm/v1/worker/gpu_model_runner.py; hash pinned in
        version_guard.MIRRORED_FUNCTIONS).
        """
        batch = self.input_batch
        discard_mask = self.discard_request_mask.np[:num_reqs]  # type: ignore[attr-defined]
        prev_req_id_to_index: dict[str, int] = {}
        for i, req_id in enumerate(batch.req_ids[:num_reqs]):
            if discard_mask[i]:
                continue
            prev_req_id_to_index[req_id] = i
            req_state = self.requests.get(req_id)
            if req_state is not None:
                req_state.output_token_ids.append(-1)
            pos = int(batch.num_tokens_no_spec[i])
            batch.is_token_ids[i, pos] = True
            batch.num_tokens_no_spec[i] = pos + 1
        batch.prev_req_id_to_index = prev_req_id_to_index


class PPSpecGPUModelRunner(PPSpecRunnerMixin, GPUModelRunner):
    """vLLM's V1 GPUModelRunner with speculative decoding under PP."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ppspec_setup()


__all__ = [
    "DrafterlessSpecConfig",
    "MissingStashError",
    "PPSpecGPUModelRunner",
    "PPSpecRunnerMixin",
]
