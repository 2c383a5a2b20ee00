"""protocol/external_round.py: one step's sampled tokens and drafts in one
static matrix, and back (external-launcher mode)."""

from __future__ import annotations

import pytest
import torch

from vllm_ppspec.choice.policy import Mode, batches_in_flight, mode_of, scheduler_of
from vllm_ppspec.protocol.external_round import pack_round, round_shape, unpack_round


def test_a_round_travels_in_a_static_shape_and_comes_back_the_same():
    sampled = torch.tensor([[5, 6, -1, -1], [7, -1, -1, -1], [8, 9, 10, 11]], dtype=torch.int32)
    drafts = [[1, 2, 3], [], [4, 5]]  # ngram may find fewer than k; a prefill none
    matrix = pack_round(sampled, drafts, capacity=8, k=3)
    assert tuple(matrix.shape) == round_shape(8, 3) == (9, 7)
    got_sampled, got_drafts = unpack_round(matrix, k=3)
    assert torch.equal(got_sampled, sampled)
    assert got_drafts == drafts


def test_a_step_without_drafts_or_with_fewer_columns_is_padded():
    matrix = pack_round(torch.tensor([[3], [4]]), [], capacity=4, k=2)
    sampled, drafts = unpack_round(matrix, k=2)
    assert sampled.tolist() == [[3, -1, -1], [4, -1, -1]]
    assert drafts == [[], []]


@pytest.mark.parametrize(
    "sampled,drafts",
    [(torch.zeros(9, 1), []), (torch.zeros(2, 5), []), (torch.zeros(2, 1), [[1], [1, 2, 3, 4]])],
)
def test_a_round_that_does_not_fit_is_refused(sampled, drafts):
    with pytest.raises(ValueError):
        pack_round(sampled, drafts, capacity=8, k=3)


def test_the_external_launcher_has_its_own_mode_one_batch_and_vllms_scheduler():
    assert mode_of(True, 2, False, external_launcher=True) is Mode.EXTERNAL
    assert mode_of(False, 2, False, external_launcher=True) is Mode.OFF
    assert mode_of(True, 1, False, external_launcher=True) is Mode.OFF
    assert mode_of(True, 2, False) is Mode.SYNC
    assert batches_in_flight(Mode.EXTERNAL, 2, one=False) == 1
    assert scheduler_of(Mode.EXTERNAL) is None
