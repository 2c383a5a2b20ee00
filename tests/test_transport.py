"""Two-process gloo tests of the round transport (last rank = rank 1 of PP=2).

Each test starts two ranks in fresh spawned processes
(tests.distributed.run_ranks); a rank that hangs is killed after a bounded time
and fails the test.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tests.distributed import run_ranks
from vllm_ppspec.accounting import next_tokens_and_counts
from vllm_ppspec.transport import RoundDivergenceError, recv_round, send_round

K = 3
LAST = 1


def _group() -> dist.ProcessGroup:
    return dist.group.WORLD  # type: ignore[return-value]


def _narrow_round(rank: int, world: int):
    # The sampler emitted 2 columns (at most one draft per request this round).
    sampled = torch.tensor([[5, 7], [9, -1], [11, -1]], dtype=torch.int32)
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]], dtype=torch.int64)
    if rank == LAST:
        rnd = send_round(_group(), LAST, 3, K, sampled, drafts)
    else:
        rnd = recv_round(_group(), LAST, 3, K)
    nxt, cnt = next_tokens_and_counts(rnd.sampled)
    return rnd.sampled.tolist(), rnd.drafts.tolist(), nxt.tolist(), cnt.tolist()


def test_round_narrower_than_k_plus_1_arrives_padded():
    results = run_ranks(_narrow_round)
    for r in results:
        assert r.error is None and not r.hung, r.message
    sampled, drafts, nxt, cnt = results[0].value
    assert sampled == [[5, 7, -1, -1], [9, -1, -1, -1], [11, -1, -1, -1]]
    assert drafts == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert nxt == [7, 9, 11] and cnt == [2, 1, 1]
    # Both ranks hold the same round.
    assert results[0].value == results[1].value


def _list_drafts(rank: int, world: int):
    sampled = torch.tensor([[3, 4, 5, 6], [8, -1, -1, -1]], dtype=torch.int32)
    if rank == LAST:
        rnd = send_round(_group(), LAST, 2, K, sampled, [[1, 2, 3], [4]])
    else:
        rnd = recv_round(_group(), LAST, 2, K)
    return rnd.sampled.tolist(), rnd.drafts.tolist()


def test_list_form_drafts_travel_as_zeros():
    results = run_ranks(_list_drafts)
    for r in results:
        assert r.error is None and not r.hung, r.message
    sampled, drafts = results[0].value
    assert sampled == [[3, 4, 5, 6], [8, -1, -1, -1]]
    assert drafts == [[0, 0, 0], [0, 0, 0]]


def _divergent_rows(rank: int, world: int):
    sampled = torch.tensor([[1, -1, -1, -1]] * 3, dtype=torch.int32)
    t0 = time.monotonic()
    try:
        if rank == LAST:
            send_round(_group(), LAST, 3, K, sampled, None)
        else:
            recv_round(_group(), LAST, 2, K)  # this rank thinks it holds 2 requests
    except RoundDivergenceError as e:
        # After the error the group is still usable: no collective was left open.
        dist.barrier()
        return ("raised", str(e), time.monotonic() - t0)
    return ("returned", "", time.monotonic() - t0)


def test_row_count_divergence_raises_on_both_ranks_quickly():
    results = run_ranks(_divergent_rows, timeout=60)
    for r in results:
        assert r.error is None and not r.hung, r.message
        outcome, msg, seconds = r.value
        assert outcome == "raised"
        assert "between 2 and 3 requests" in msg
        assert seconds < 10


def _sender_batch_mismatch(rank: int, world: int):
    sampled = torch.tensor([[1, -1, -1, -1]] * 3, dtype=torch.int32)
    try:
        if rank == LAST:
            # 3 sampled rows but the sender's input batch holds 4 requests.
            send_round(_group(), LAST, 4, K, sampled, None)
        else:
            recv_round(_group(), LAST, 3, K)
    except RoundDivergenceError as e:
        dist.barrier()
        return str(e)
    return None


def test_sender_row_check_against_its_batch_raises_everywhere():
    results = run_ranks(_sender_batch_mismatch)
    for r in results:
        assert r.error is None and not r.hung, r.message
        assert r.value is not None
    assert "sampled 3 rows but its input batch holds 4" in results[1].value
    assert "rows differ" in results[0].value or "sampled 3 rows" in results[0].value


def _too_wide(rank: int, world: int):
    sampled = torch.ones((2, K + 2), dtype=torch.int32)  # wider than k + 1
    try:
        if rank == LAST:
            send_round(_group(), LAST, 2, K, sampled, None)
        else:
            recv_round(_group(), LAST, 2, K)
    except RoundDivergenceError as e:
        dist.barrier()
        return str(e)
    return None


def test_malformed_sampled_tensor_raises_everywhere():
    results = run_ranks(_too_wide)
    for r in results:
        assert r.error is None and not r.hung, r.message
        assert r.value is not None
    assert "more than num_speculative_tokens + 1" in results[1].value


def _k_mismatch(rank: int, world: int):
    try:
        if rank == LAST:
            send_round(_group(), LAST, 1, 3, torch.tensor([[1, 2, -1, -1]]), None)
        else:
            recv_round(_group(), LAST, 1, 2)
    except RoundDivergenceError as e:
        return str(e)
    return None


def test_num_spec_tokens_mismatch_raises_everywhere():
    results = run_ranks(_k_mismatch)
    for r in results:
        assert r.error is None and not r.hung, r.message
        assert "num_speculative_tokens between 2 and 3" in r.value
