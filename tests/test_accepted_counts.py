"""Accepted counts rebuilt from the scheduler's figures (sync scheduling, hybrid models)."""

from __future__ import annotations

import pytest

from vllm_ppspec.protocol.accepted_counts import AcceptedCounts


def test_valid_tokens_follow_the_schedulers_rollback():
    counts = AcceptedCounts()
    assert counts.valid_tokens("a", 10) is None  # new request: nothing on record
    # Round: 10 computed, 4 scheduled (1 token + 3 drafts).
    counts.record("a", 10, 4, 3)
    # The scheduler rolls back rejected drafts: 2 accepted -> 10 + 4 - 1 = 13.
    assert counts.valid_tokens("a", 13) == 3
    assert counts.valid_tokens("a", 14) == 4  # all accepted
    assert counts.valid_tokens("a", 11) == 1  # all rejected
    # A prefill chunk (no drafts): the next round starts right after it.
    counts.record("b", 0, 64, 0)
    assert counts.valid_tokens("b", 64) == 1
    counts.forget("a")
    assert counts.valid_tokens("a", 13) is None and len(counts) == 1


def test_figures_that_no_round_explains_raise():
    counts = AcceptedCounts()
    counts.record("a", 10, 4, 3)
    with pytest.raises(ValueError, match="implies 4 accepted"):
        counts.valid_tokens("a", 15)
    with pytest.raises(ValueError, match="implies -1 accepted"):
        counts.valid_tokens("a", 10)
