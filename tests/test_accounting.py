"""Pure tensor functions of one speculative round."""

from __future__ import annotations

import pytest
import torch

from vllm_ppspec.protocol.accounting import (
    draft_matrix,
    next_tokens_and_counts,
    pad_sampled,
)


def test_pad_sampled_fills_missing_columns_with_minus_one():
    out = pad_sampled(torch.tensor([[4], [5]]), 3)
    assert out.dtype == torch.int32
    assert out.tolist() == [[4, -1, -1, -1], [5, -1, -1, -1]]
    full = torch.tensor([[1, 2, 3, 4]])
    assert pad_sampled(full, 3).tolist() == [[1, 2, 3, 4]]


def test_pad_sampled_rejects_a_wider_tensor():
    with pytest.raises(ValueError, match="more than num_speculative_tokens"):
        pad_sampled(torch.ones((1, 5), dtype=torch.int64), 3)


def test_draft_matrix_tensor_list_and_none():
    t = torch.tensor([[7, 8], [9, 10]])
    assert draft_matrix(t, 2, 3).tolist() == [[7, 8, 0], [9, 10, 0]]
    assert draft_matrix([[1, 2, 3], [4]], 2, 3).tolist() == [[0, 0, 0], [0, 0, 0]]
    assert draft_matrix(None, 1, 2).tolist() == [[0, 0]]
    with pytest.raises(ValueError):
        draft_matrix(torch.zeros((3, 3)), 2, 3)


def test_next_tokens_and_counts_full_partial_none_and_discarded():
    sampled = torch.tensor(
        [
            [11, 12, 13, 14],  # all 3 drafts accepted + bonus
            [21, 22, -1, -1],  # 1 accepted + recovered
            [31, -1, -1, -1],  # all rejected
            [41, -1, -1, -1],  # partial prefill: sample discarded
            [-1, -1, -1, -1],  # nothing valid
        ],
        dtype=torch.int32,
    )
    discard = torch.tensor([False, False, False, True, False])
    nxt, cnt = next_tokens_and_counts(sampled, discard=discard)
    assert nxt.tolist() == [14, 22, 31, 0, 0]
    assert cnt.tolist() == [4, 2, 1, 0, 0]


def test_out_of_vocab_ids_are_not_counted():
    sampled = torch.tensor([[5, 600, -1]], dtype=torch.int32)
    nxt, cnt = next_tokens_and_counts(sampled, vocab_size=512)
    assert cnt.tolist() == [1] and nxt.tolist() == [5]
