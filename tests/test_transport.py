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
from vllm_ppspec.protocol.rounds import ROUND_TAG, RoundChannel, RoundDivergenceError

K = 3
LAST = 1
CAPACITY = 8  # max_num_seqs


def _channel(k: int = K, capacity: int = CAPACITY) -> RoundChannel:
    return RoundChannel(dist.group.WORLD, LAST, capacity, k)  # type: ignore[arg-type]


def _narrow_round(rank: int, world: int):
    # The sampler emitted 2 columns (at most one draft per request this round).
    sampled = torch.tensor([[5, 7], [9, -1], [11, -1]], dtype=torch.int32)
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]], dtype=torch.int64)
    if rank == LAST:
        rnd = _channel().post(3, sampled, drafts).wait()
    else:
        rnd = _channel().expect(3).wait()
    return rnd.sampled.tolist(), rnd.drafts.tolist()


def test_round_narrower_than_k_plus_1_arrives_padded():
    results = run_ranks(_narrow_round)
    for r in results:
        assert r.error is None and not r.hung, r.message
    sampled, drafts = results[0].value
    assert sampled == [[5, 7, -1, -1], [9, -1, -1, -1], [11, -1, -1, -1]]
    assert drafts == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    # Both ranks hold the same round.
    assert results[0].value == results[1].value


def _list_drafts(rank: int, world: int):
    sampled = torch.tensor([[3, 4, 5, 6], [8, -1, -1, -1]], dtype=torch.int32)
    if rank == LAST:
        rnd = _channel().post(2, sampled, [[1, 2, 3], [4]]).wait()
    else:
        rnd = _channel().expect(2).wait()
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
            _channel().post(3, sampled, None).wait()
        else:
            _channel().expect(2).wait()  # this rank thinks it holds 2 requests
    except RoundDivergenceError as e:
        # After the error the group is still usable: no message was left open.
        dist.barrier()
        return ("raised", str(e), e.every_rank, time.monotonic() - t0)
    dist.barrier()
    return ("returned", "", None, time.monotonic() - t0)


def test_row_count_divergence_raises_on_the_receiver_quickly():
    # Rounds go one way: the receiver sees the difference and raises alone
    # (every_rank False, so that its worker ends: test_rank_errors.py).
    results = run_ranks(_divergent_rows, timeout=60)
    for r in results:
        assert r.error is None and not r.hung, r.message
    receiver, sender = results[0].value, results[1].value
    outcome, message, every_rank, seconds = receiver
    assert outcome == "raised" and every_rank is False
    assert "between 2 and 3 requests" in message
    assert "this rank's step 2" in message
    assert seconds < 10
    assert sender[0] == "returned"


def _sender_batch_mismatch(rank: int, world: int):
    sampled = torch.tensor([[1, -1, -1, -1]] * 3, dtype=torch.int32)
    try:
        if rank == LAST:
            # 3 sampled rows but the sender's input batch holds 4 requests.
            _channel().post(4, sampled, None).wait()
        else:
            _channel().expect(3).wait()
    except RoundDivergenceError as e:
        dist.barrier()
        return str(e) if e.every_rank else "every_rank is False"
    return None


def test_sender_row_check_against_its_batch_raises_everywhere():
    results = run_ranks(_sender_batch_mismatch)
    for r in results:
        assert r.error is None and not r.hung, r.message
        assert r.value is not None
    assert "sampled 3 rows but its input batch holds 4" in results[1].value
    assert "rows differ" in results[0].value


def _too_wide(rank: int, world: int):
    sampled = torch.ones((2, K + 2), dtype=torch.int32)  # wider than k + 1
    try:
        if rank == LAST:
            _channel().post(2, sampled, None).wait()
        else:
            _channel().expect(2).wait()
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
            _channel(k=3).post(1, torch.tensor([[1, 2, -1, -1]]), None).wait()
        else:
            _channel(k=2).expect(1).wait()
    except RoundDivergenceError as e:
        return str(e)
    return None


def test_num_spec_tokens_mismatch_raises_everywhere():
    results = run_ranks(_k_mismatch)
    for r in results:
        assert r.error is None and not r.hung, r.message
        assert "num_speculative_tokens between 2 and 3" in r.value


def _rounds_counted(rank: int, world: int):
    """Three rounds of different sizes on one channel; count the collectives."""
    calls = {"all_reduce": 0, "broadcast": 0, "isend": 0, "irecv": 0, "send": 0, "recv": 0}
    for name in calls:
        original = getattr(dist, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            if _name in ("isend", "irecv"):
                assert kwargs.get("tag") == ROUND_TAG  # never vLLM's tag 0
            return _original(*args, **kwargs)

        setattr(dist, name, counted)
    channel = _channel()
    got = []
    for rows in (3, 1, CAPACITY):
        sampled = torch.arange(rows * (K + 1), dtype=torch.int32).view(rows, K + 1)
        drafts = torch.arange(rows * K).view(rows, K) + 1000
        rnd = (
            channel.post(rows, sampled, drafts).wait()
            if rank == LAST
            else channel.expect(rows).wait()
        )
        got.append((rnd.sampled.tolist(), rnd.drafts.tolist()))
    return got, calls


def test_one_message_per_round_one_way_after_one_shape_check():
    results = run_ranks(_rounds_counted)
    for r in results:
        assert r.error is None and not r.hung, r.message
    # 1 shape agreement on every rank, then one message per round: the last
    # rank sends it, the other receives it; nothing else.
    receiver, sender = results[0].value[1], results[1].value[1]
    assert sender == {"all_reduce": 1, "broadcast": 0, "isend": 3, "irecv": 0, "send": 0, "recv": 0}
    assert receiver == {
        "all_reduce": 1,
        "broadcast": 0,
        "isend": 0,
        "irecv": 3,
        "send": 0,
        "recv": 0,
    }
    assert results[0].value[0] == results[1].value[0]
    sampled, drafts = results[0].value[0][2]
    assert sampled[-1] == list(range((CAPACITY - 1) * (K + 1), CAPACITY * (K + 1)))
    assert drafts[0] == [1000, 1001, 1002]


def _capacity_mismatch(rank: int, world: int):
    try:
        if rank == LAST:
            _channel(capacity=16).post(1, torch.tensor([[1, -1, -1, -1]]), None).wait()
        else:
            _channel(capacity=8).expect(1).wait()
    except RoundDivergenceError as e:
        dist.barrier()
        return str(e)
    return None


def test_max_num_seqs_mismatch_raises_everywhere_before_any_round():
    results = run_ranks(_capacity_mismatch, timeout=60)
    for r in results:
        assert r.error is None and not r.hung, r.message
        assert "max_num_seqs between 8 and 16" in r.value


def _over_capacity(rank: int, world: int):
    rows = CAPACITY + 1
    try:
        if rank == LAST:
            _channel().post(rows, torch.ones((rows, K + 1), dtype=torch.int32), None).wait()
        else:
            _channel().expect(rows).wait()
    except RoundDivergenceError as e:
        dist.barrier()
        return str(e)
    return None


def test_more_rows_than_max_num_seqs_raises_everywhere():
    results = run_ranks(_over_capacity, timeout=60)
    for r in results:
        assert r.error is None and not r.hung, r.message
        assert f"more than max_num_seqs={CAPACITY}" in r.value


def _posted_rounds(rank: int, world: int):
    ch = _channel()
    # Both ranks agree the shape first, as the runner does at start-up; then
    # even the first round is posted without waiting for the receiver.
    ch.agree_shape()
    if rank == LAST:
        t0 = time.perf_counter()
        first = ch.post(1, torch.tensor([[6, -1]]), torch.tensor([[1, 2, 3]]))
        second = ch.post(2, torch.tensor([[7, 8], [9, -1]]), torch.tensor([[1, 2, 3], [4, 5, 6]]))
        posted_s = time.perf_counter() - t0
        got = [first.wait().sampled.tolist(), second.wait().sampled.tolist()]
        assert first.local is not None
        return posted_s, first.local.sampled.tolist(), got
    time.sleep(2.0)  # the last rank posts meanwhile; it must not wait for this rank
    return None, None, [ch.expect(1).wait().sampled.tolist(), ch.expect(2).wait().sampled.tolist()]


def test_posted_rounds_do_not_wait_for_the_receivers_and_arrive_in_order():
    results = run_ranks(_posted_rounds)
    for r in results:
        assert r.error is None and not r.hung, r.message
    receiver, sender = results[0].value, results[1].value
    posted_s, local, got = sender
    assert posted_s < 1.0, posted_s  # the receiver only joined 2 s later
    assert local == [[6, -1, -1, -1]]  # what the sender recorded is what it sent
    assert receiver[2] == got == [[[6, -1, -1, -1]], [[7, 8, -1, -1], [9, -1, -1, -1]]]


def _posted_divergence(rank: int, world: int):
    ch = _channel()
    if rank == LAST:
        ch.post(2, torch.tensor([[1, -1], [2, -1]]), None).wait()
        return "sent"
    ch.expect(3).wait()


def test_a_posted_round_that_diverges_raises_on_the_receiver():
    results = run_ranks(_posted_divergence)
    for r in results:
        assert not r.hung, r.message
    assert results[0].error == "RoundDivergenceError", results[0].message
    assert results[1].error is None and results[1].value == "sent"


# The receiver posts its side of two rounds before the sender has them
# (``expect``, as a non-last rank does at the end of its step), computes, then
# waits for them. Over the delay line, not the loopback: gloo moves a message
# once its receive is posted, so a receive posted only when waited on would
# cost the receiver a round trip there (2 x DELAY_MS); on the loopback that is
# microseconds and passes too.
EARLY_RECEIVE = """
import json, sys, time
import torch, torch.distributed as dist
from vllm_ppspec.protocol.rounds import RoundChannel
rank, master = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://{master}:29535", rank=rank, world_size=2)
ch = RoundChannel(dist.group.WORLD, 1, 8, 3)
ch.agree_shape()
out = None
if rank == 1:
    time.sleep(0.5)
    ch.post(1, torch.tensor([[6, -1]]), torch.tensor([[1, 2, 3]])).wait()
    ch.post(2, torch.tensor([[7, 8], [9, -1]]), torch.tensor([[1, 2, 3], [4, 5, 6]])).wait()
else:
    first, second = ch.expect(1), ch.expect(2)  # returns at once
    time.sleep(1.5)  # computing; the rounds arrive meanwhile
    t0 = time.perf_counter()
    got = [first.wait().sampled.tolist(), second.wait().sampled.tolist()]
    out = [time.perf_counter() - t0, got]
dist.barrier()
print(json.dumps(out), flush=True)
"""
DELAY_MS = 30.0


def test_a_receiver_posts_its_side_early_and_then_pays_no_wait():
    from tests.delay_ranks import run_two_ranks

    (waited, got), _ = run_two_ranks(EARLY_RECEIVE, "early", 235, DELAY_MS)
    assert got == [[[6, -1, -1, -1]], [[7, 8, -1, -1], [9, -1, -1, -1]]]
    # Both rounds were already there: well under one one-way trip of the link.
    assert waited < 0.5 * DELAY_MS / 1000, waited


def _late_round(rank: int, world: int):
    """The receiver waits for a round the sender sends only 0.5 s later."""
    ch = _channel()
    ch.agree_shape()
    if rank == LAST:
        time.sleep(0.5)
        ch.post(1, torch.tensor([[6, -1]]), None).wait()
        return None
    t0 = time.perf_counter()
    rnd = ch.expect(1).wait()
    return time.perf_counter() - t0, rnd.travel_wait_s


def test_a_round_counts_as_travel_only_the_wait_after_it_was_sent():
    results = run_ranks(_late_round)
    for r in results:
        assert r.error is None and not r.hung, r.message
    waited, travel = results[0].value
    assert waited >= 0.45, waited  # the receiver waited for the sender ...
    # ... but the round, once sent, came at once: the 0.5 s before the send is
    # not travel (a loaded machine delays the receiver's wake-up by up to ~0.1 s).
    assert 0.0 <= travel < 0.25 and travel < waited - 0.3, (travel, waited)


def _expected_divergence(rank: int, world: int):
    ch = _channel()
    if rank == LAST:
        ch.post(2, torch.tensor([[1, -1], [2, -1]]), None).wait()
        return "sent"
    ch.expect(3).wait()  # this rank's step held 3 requests


def test_an_expected_round_that_diverges_raises_on_the_receiver():
    results = run_ranks(_expected_divergence)
    for r in results:
        assert not r.hung, r.message
    assert results[0].error == "RoundDivergenceError", results[0].message
    assert results[1].error is None and results[1].value == "sent"
