"""Pure tensor functions of one speculative round."""

from __future__ import annotations

import pytest
import torch

from vllm_ppspec.protocol.accounting import draft_matrix, pad_sampled


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
