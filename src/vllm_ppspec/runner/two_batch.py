"""The runner's part in two-batch mode (async scheduling, lanes off).

Per speculative round (one ``execute_model`` + ``sample_tokens`` pair):

* last rank: vLLM samples and drafts as usual. The sampled tensor is captured
  where vLLM hands it to ``_update_states_after_model_execute``; vLLM's own
  ``[num_reqs, 1]`` broadcast on the device group is suppressed. At the end of
  ``sample_tokens`` the round goes out through :meth:`RoundChannel.send`.
* other ranks: ``execute_model`` stashes the ``scheduler_output`` when it
  returns intermediate tensors; ``sample_tokens`` receives the round
  (:meth:`RoundChannel.recv`) and then replays what the sampler's rank did:
  ``_update_states_after_model_execute`` (hybrid models: accepted counts for
  the recurrent-state shift), the next-token/valid-count hand-off
  (``_copy_valid_sampled_token_count``), the placeholder bookkeeping vLLM does
  for the last rank, and the draft tensor that the next step scatters into its
  input ids.

Messages: one round per ``sample_tokens`` (:mod:`vllm_ppspec.protocol.rounds`):
the last rank sends it after its sampler and drafter ran, every other rank
receives it before it returns. A rank whose round cannot be applied raises
only after it received the round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.v1.outputs import ModelRunnerOutput

from vllm_ppspec.protocol import faults
from vllm_ppspec.protocol.accounting import next_tokens_and_counts
from vllm_ppspec.protocol.rounds import Round, RoundChannel
from vllm_ppspec.runner.clocks import Clocks
from vllm_ppspec.runner.rank_errors import MissingStashError


class TwoBatchSteps:
    def __init__(
        self,
        channel: RoundChannel,
        is_last: bool,
        rank: int,
        fault: faults.Faults,
        clocks: Clocks,
    ) -> None:
        self.channel = channel
        self.is_last = is_last
        self.rank = rank
        self.fault = fault
        self.clocks = clocks
        self.stash: Any = None  # non-last ranks: the scheduler output of the step in flight

    def after_update_states(self, runner: Any, scheduler_output: Any) -> None:
        if not self.is_last:
            self.trim_optimistic_outputs(runner, scheduler_output)

    @staticmethod
    def trim_optimistic_outputs(runner: Any, scheduler_output: Any) -> None:
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
        batch = runner.input_batch
        for i, req_id in enumerate(req_data.req_ids):
            req_state = runner.requests.get(req_id)
            num_output_tokens = req_data.num_output_tokens[i]
            if req_state is None or num_output_tokens >= len(req_state.output_token_ids):
                continue
            del req_state.output_token_ids[num_output_tokens:]
            req_index = batch.req_id_to_index.get(req_id)
            if req_index is not None:
                batch.num_tokens_no_spec[req_index] = (
                    batch.num_prompt_tokens[req_index] + num_output_tokens
                )

    def sample_last(self, runner: Any, sampled_by_vllm: tuple[Any, Any]) -> Any:
        """Last rank: send the round vLLM just sampled and drafted."""
        output, sampled = sampled_by_vllm
        with self.clocks.timing("wait_s"):
            self.channel.send(runner.input_batch.num_reqs, sampled, runner._draft_token_ids)
        return output

    def sample_other(self, runner: Any, step: int, replay: Callable[[Any, Any], None]) -> Any:
        """Non-last ranks: receive the round and apply it.

        Mirrors the non-last branch of ``GPUModelRunner.sample_tokens``
        (vllm/v1/worker/gpu_model_runner.py; hash pinned in
        version_guard.MIRRORED_FUNCTIONS): pass the KV connector output through
        and receive what the last rank sampled; here the round replaces
        ``_pp_receive_prev_sampled_token_ids_to_input_batch``. ``replay`` is
        vLLM's ``_update_states_after_model_execute``.
        """
        kv_connector_output = runner.kv_connector_output
        runner.kv_connector_output = None
        stash, self.stash = self.stash, None
        if self.fault.fires("drop_stash", step):
            stash = None
        with self.clocks.timing("wait_s"):
            rnd = self.channel.recv(runner.input_batch.num_reqs)
        self.clocks.received(rnd)
        # Raise only now, with the round consumed, so the last rank is not left
        # waiting for its message to be received.
        if stash is None:
            raise MissingStashError.on_rank(
                self.rank, "a scheduler_output stashed by execute_model"
            )
        self.apply_round(runner, rnd, stash, step, replay)
        return ModelRunnerOutput.with_kv_conn_output_only(kv_connector_output)

    def apply_round(
        self, runner: Any, rnd: Round, scheduler_output: Any, step: int, replay: Any
    ) -> None:
        if self.fault.fires("raise_in_round", step):
            raise faults.InjectedFault(f"raise_in_round@{step} on a non-last rank")
        num_reqs = runner.input_batch.num_reqs
        sampled = rnd.sampled.to(runner.device)
        # Hybrid models: the same accepted counts the sampler's rank applies to
        # its recurrent state (vLLM returns early for other models). The
        # fault switch exists only so that a test can prove that skipping
        # this breaks hybrid models.
        if not self.fault.skip_state_replay:
            replay(sampled, scheduler_output)
        discard = runner.discard_request_mask.gpu[:num_reqs]
        next_ids, counts = next_tokens_and_counts(
            sampled, discard=discard, vocab_size=runner.input_batch.vocab_size
        )
        self.record_placeholders(runner, num_reqs)
        runner._copy_valid_sampled_token_count(next_ids, counts)
        runner._draft_token_ids = rnd.drafts.to(runner.device)
        runner.prev_num_spec_tokens = runner.num_spec_tokens

    @staticmethod
    def record_placeholders(runner: Any, num_reqs: int) -> None:
        """The async bookkeeping vLLM does on the sampler's rank.

        Each request whose sample is kept gets one ``-1`` placeholder output
        token and one more token slot; the next step's input ids for it come
        from ``prev_sampled_token_ids`` on the device. Discarded requests
        (partial prefills) keep their CPU token ids. Mirrors
        ``GPUModelRunner._pp_receive_prev_sampled_token_ids_to_input_batch``
        (vllm/v1/worker/gpu_model_runner.py; hash pinned in
        version_guard.MIRRORED_FUNCTIONS).
        """
        batch = runner.input_batch
        discard_mask = runner.discard_request_mask.np[:num_reqs]
        prev_req_id_to_index: dict[str, int] = {}
        for i, req_id in enumerate(batch.req_ids[:num_reqs]):
            if discard_mask[i]:
                continue
            prev_req_id_to_index[req_id] = i
            req_state = runner.requests.get(req_id)
            if req_state is not None:
                req_state.output_token_ids.append(-1)
            pos = int(batch.num_tokens_no_spec[i])
            batch.is_token_ids[i, pos] = True
            batch.num_tokens_no_spec[i] = pos + 1
        batch.prev_req_id_to_index = prev_req_id_to_index
