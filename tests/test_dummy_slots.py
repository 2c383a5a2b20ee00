"""A dummy batch writes nothing into the drafter's KV cache.

vLLM's own ``SpecDecodeBaseProposer.dummy_run`` runs on a stub drafter, called
the way ``GPUModelRunner._dummy_run`` calls it (slot mappings that name the
drafter's layer, all ``PADDING_SLOT_ID``), under the runner mixin's
``_dummy_run``. Its forwards must see only padding slots: with the drafter's
own buffer still holding the last proposal's slots, they wrote K/V into that
live request's drafter cache (the DP=2 x PP=2 acceptance bug,
``tests/test_e2e_dp.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

LAYER = "draft_model.model.layers.0.self_attn.attn"
K = 3
LAST_PROPOSAL_SLOTS = [37, 38, 39, 40]  # slots of a live request


class _Model:
    """Records the slot mapping each drafter forward would write K/V with."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def __call__(self, **kwargs):
        from vllm.forward_context import get_forward_context

        self.seen.append(get_forward_context().slot_mapping[LAYER].tolist())


def _drafter():
    from vllm.config import CUDAGraphMode
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    drafter = object.__new__(SpecDecodeBaseProposer)
    drafter.vllm_config = SimpleNamespace(
        parallel_config=SimpleNamespace(
            data_parallel_size=1, use_sequence_parallel_moe=False, is_moe_model=False
        ),
        compilation_config=SimpleNamespace(fast_moe_cold_start=False, static_forward_context={}),
    )
    drafter.parallel_drafting = False
    drafter.num_speculative_tokens = K
    drafter.supports_mm_inputs = False
    drafter.pass_hidden_states_to_model = False
    drafter.uses_mrope = False
    drafter.input_ids = torch.zeros(16, dtype=torch.int32)
    drafter.positions = torch.zeros(16, dtype=torch.int64)
    drafter._draft_attn_layer_names = {LAYER}
    drafter._slot_mapping_buffer = torch.zeros(16, dtype=torch.int64)
    drafter._slot_mapping_buffer[: len(LAST_PROPOSAL_SLOTS)] = torch.tensor(LAST_PROPOSAL_SLOTS)
    drafter._determine_batch_execution_and_padding = lambda n, use_cudagraphs=True: (
        CUDAGraphMode.NONE,
        n,
        None,
    )
    drafter.model = _Model()
    return drafter


class _UpstreamRunner:
    """Stands in for GPUModelRunner._dummy_run: the target's slots padded, then
    the drafter's dummy run with them (vllm/v1/worker/gpu_model_runner.py)."""

    def _dummy_run(self, num_tokens: int, **kwargs):
        slot_mappings = {LAYER: torch.full((num_tokens,), -1, dtype=torch.int64)}
        self.drafter.dummy_run(num_tokens, use_cudagraphs=False, slot_mappings=slot_mappings)


def test_a_dummy_batch_gives_the_drafter_only_padding_slots():
    from vllm_ppspec.runner.mixin import PPSpecRunnerMixin

    class Runner(PPSpecRunnerMixin, _UpstreamRunner):
        pass

    runner = Runner()
    runner.speculative_config = SimpleNamespace(method="draft_model")
    runner.drafter = _drafter()
    runner._dummy_run(4)  # execute_dummy_batch: uniform_decode_query_len = 1 + k tokens
    assert runner.drafter.model.seen == [[-1] * 4] * K


def test_vllms_dummy_run_alone_writes_into_the_last_proposals_slots():
    """Why the runner clears the buffer: vLLM's dummy_run swaps the padded slot
    mappings it is given for the drafter's own buffer. When this fails, vLLM
    passes the padding through and ``clear_dummy_slots`` can go."""
    drafter = _drafter()
    _UpstreamRunner._dummy_run(SimpleNamespace(drafter=drafter), 4)
    assert drafter.model.seen == [LAST_PROPOSAL_SLOTS] * K


def test_clear_dummy_slots_skips_drafters_without_a_slot_buffer():
    from vllm_ppspec.runner.drafter.dp_hook import clear_dummy_slots

    clear_dummy_slots(None)  # no drafter on this rank
    clear_dummy_slots(SimpleNamespace())  # ngram and other drafters without a model
