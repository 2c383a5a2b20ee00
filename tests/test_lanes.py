"""Async lanes, worker side: a step made sync-shaped from each request's previous round.

Scheduler outputs are built by hand with vLLM's own dataclasses, in the state
vLLM's ``AsyncScheduler`` leaves them when a request's previous round (PP
steps earlier) is still unprocessed: optimistic counts, no tokens of that
round, ``-1`` drafts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm.v1.core.sched.output import CachedRequestData

from vllm_ppspec.protocol.lane_book import LaneBook, LaneError, make_sync_shaped

K = 3
PROMPT = [11, 12, 13, 14]  # every request's prompt here
PROMPT_LEN = {"a": 4, "b": 4, "c": 4}


class _Output:
    """The fields of vLLM's SchedulerOutput that lanes read and rewrite."""

    def __init__(self, cached: CachedRequestData, scheduled: dict, spec: dict) -> None:
        self.scheduled_cached_reqs = cached
        self.num_scheduled_tokens = scheduled
        self.scheduled_spec_decode_tokens = spec


def _cached(rows: list[tuple[str, list[int], int, int]], resumed=()) -> CachedRequestData:
    """rows: (req_id, all_token_ids, num_computed_tokens, num_output_tokens)."""
    return CachedRequestData(
        req_ids=[r[0] for r in rows],
        resumed_req_ids=set(resumed),
        new_token_ids=[],
        all_token_ids={r[0]: list(r[1]) for r in rows},
        new_block_ids=[None] * len(rows),
        num_computed_tokens=[r[2] for r in rows],
        num_output_tokens=[r[3] for r in rows],
    )


def _book_with_round(step: int = 2) -> LaneBook:
    """Step 2 verified 3 drafts for "a" (2 accepted: 21, 22, then bonus 23) and
    for "b" (none accepted: 31); "c" was a partial prefill (discarded)."""
    book = LaneBook()
    book.scheduled(step, ["a", "b", "c"])
    sampled = torch.tensor([[21, 22, 23, -1], [31, -1, -1, -1], [99, -1, -1, -1]])
    drafts = torch.tensor([[24, 25, 26], [32, 33, 34], [0, 0, 0]])
    book.record(
        step, ["a", "b", "c"], sampled, drafts, np.array([False, False, True]), {"a": 3, "b": 3}
    )
    return book


def test_optimistic_step_is_rewritten_as_sync_scheduling_would_send_it():
    # Before step 2 "a" had one output token (20) and 4 computed tokens (the
    # last token, 20, not computed yet); step 2 scheduled 1 + 3 tokens. The
    # async scheduler assumed all 3 drafts accepted: computed 4 + 4 = 8, output
    # 1 + 4 = 5 (4 placeholders), and schedules step 4 with 1 + 3 placeholders.
    book = _book_with_round()
    cached = _cached([("a", PROMPT + [20], 8, 5), ("b", PROMPT + [30], 8, 5)])
    out = _Output(cached, {"a": 4, "b": 4}, {"a": [-1] * K, "b": [-1] * K})
    make_sync_shaped(out, book, PROMPT_LEN.__getitem__)
    # "a": 2 drafts accepted, 1 rejected: the round's tokens appended, counts
    # cut by the rejected draft, the drafts proposed after the round in place.
    assert cached.all_token_ids["a"] == PROMPT + [20, 21, 22, 23]
    assert cached.num_output_tokens[0] == 4
    assert cached.num_computed_tokens[0] == 7  # 4 + 1 + 2 accepted: 23 not computed
    assert out.scheduled_spec_decode_tokens["a"] == [24, 25, 26]
    # "b": no draft accepted.
    assert cached.all_token_ids["b"] == PROMPT + [30, 31]
    assert cached.num_output_tokens[1] == 2
    assert cached.num_computed_tokens[1] == 5
    assert out.scheduled_spec_decode_tokens["b"] == [32, 33, 34]
    # Non-last ranks get the sampled token to compute, as the sync scheduler
    # sends it under PP (the tokens to compute that are not drafts).
    assert cached.new_token_ids == [[23], [31]]


def test_a_round_the_scheduler_already_processed_is_not_applied_twice():
    # "a" skipped a lane step: its round was processed (no placeholders), so
    # the scheduler's figures are exact; only its drafts come from the round.
    book = _book_with_round()
    tokens = PROMPT + [20, 21, 22, 23]
    cached = _cached([("a", tokens, 7, 4)])
    out = _Output(cached, {"a": 4}, {"a": [-1] * K})
    make_sync_shaped(out, book, PROMPT_LEN.__getitem__)
    assert cached.all_token_ids["a"] == tokens
    assert (cached.num_computed_tokens[0], cached.num_output_tokens[0]) == (7, 4)
    assert out.scheduled_spec_decode_tokens["a"] == [24, 25, 26]
    assert cached.new_token_ids == [[23]]


def test_a_prefill_chunk_is_passed_through_with_its_prompt_tokens():
    book = _book_with_round()
    long_prompt = list(range(100, 110))
    cached = _cached([("c", long_prompt, 4, 0)])
    out = _Output(cached, {"c": 6}, {})
    make_sync_shaped(out, book, {"c": 10}.__getitem__)
    assert cached.num_computed_tokens == [4]
    assert cached.new_token_ids == [long_prompt[4:10]]


def test_round_of_an_older_step_is_not_used():
    # "a" was preempted after step 2 and resumed at step 5 (recorded as
    # scheduled there): step 2's round belongs to before the preemption.
    book = _book_with_round()
    book.scheduled(5, ["a"])
    cached = _cached([("a", PROMPT + [20], 8, 5)])
    out = _Output(cached, {"a": 4}, {"a": [-1] * K})
    with pytest.raises(LaneError, match="no round of its previous step"):
        make_sync_shaped(out, book, PROMPT_LEN.__getitem__)
    # A resumed request recomputes from the scheduler's tokens; vLLM's -1
    # padding drafts stay (the sampler rejects them, as under sync).
    cached = _cached([("a", PROMPT + [20], 4, 1)], resumed={"a"})
    out = _Output(cached, {"a": 4}, {"a": [-1] * K})
    make_sync_shaped(out, book, PROMPT_LEN.__getitem__)
    assert out.scheduled_spec_decode_tokens["a"] == [-1] * K
    assert cached.num_computed_tokens == [4]
    assert cached.new_token_ids == [[20]]


def test_scheduler_lagging_by_other_than_one_round_raises():
    book = _book_with_round()
    # 8 placeholders: two rounds outstanding, which lanes never schedule.
    cached = _cached([("a", PROMPT + [20], 12, 9)])
    out = _Output(cached, {"a": 4}, {"a": [-1] * K})
    with pytest.raises(LaneError, match="must lag by one round"):
        make_sync_shaped(out, book, PROMPT_LEN.__getitem__)


def test_missing_tells_a_receiver_to_take_more_rounds():
    book = LaneBook()
    book.scheduled(2, ["a"])
    cached = _cached([("a", PROMPT + [20], 8, 5)])
    out = _Output(cached, {"a": 4}, {"a": [-1] * K})
    assert book.missing(out, PROMPT_LEN.__getitem__)
    book.record(
        2,
        ["a"],
        torch.tensor([[21, 22, 23, -1]]),
        torch.tensor([[24, 25, 26]]),
        np.array([False]),
        {"a": 3},
    )
    assert not book.missing(out, PROMPT_LEN.__getitem__)
    book.forget(["a"])
    assert "a" not in book.rounds and "a" not in book.last_step


def test_a_round_arriving_after_its_request_finished_is_not_kept():
    # A finished request's wasted last step: its round reaches a non-last rank
    # after the step that reported the finish forgot the request.
    book = LaneBook()
    book.scheduled(2, ["a", "b"])
    book.forget(["a"])
    book.record(
        2,
        ["a", "b"],
        torch.tensor([[21, -1, -1, -1], [31, -1, -1, -1]]),
        torch.tensor([[24, 25, 26], [32, 33, 34]]),
        np.array([False, False]),
        {"a": 3, "b": 3},
    )
    assert set(book.rounds) == {"b"}
