"""runner/drafter/suffix_requests.py: a suffix drafter's cache ends a request
when it finishes, not when it sits out a step (on arctic-inference's real
SuffixDecodingCache, scripts/setup_suffix.sh)."""

from __future__ import annotations

import numpy as np

from vllm_ppspec.runner.drafter.suffix_requests import SuffixRequests, for_drafter


def _cache():
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    return SuffixDecodingCache(max_tree_depth=24, max_cached_requests=16)


def _propose_like_vllm(cache, batch: set[str]) -> None:
    """What SuffixDecodingProposer.propose does last: end every active request
    missing from the batch."""
    for req_id in cache.active_requests - batch:
        cache.stop_request(req_id)


def test_a_request_sitting_out_a_step_keeps_its_state_until_it_finishes():
    cache = _cache()
    keep = SuffixRequests(cache)
    for r in ("a", "b"):
        cache.start_request(r, np.array([5, 6, 7], dtype=np.int32))
    with keep.proposing():
        _propose_like_vllm(cache, {"a"})  # "b" sits out this step
    assert set(cache.active_requests) == {"a", "b"}
    keep.finished(["b", "gone"])
    assert set(cache.active_requests) == {"a"}
    # Outside propose the cache's own stop_request is back.
    _propose_like_vllm(cache, set())
    assert set(cache.active_requests) == set()


def test_without_it_vllm_ends_the_request_that_sits_out():
    cache = _cache()
    cache.start_request("b", np.array([5, 6, 7], dtype=np.int32))
    _propose_like_vllm(cache, {"a"})
    assert "b" not in cache.active_requests


def test_only_a_suffix_drafter_gets_one():
    from types import SimpleNamespace

    drafter = SimpleNamespace(suffix_cache=_cache())
    assert isinstance(for_drafter(drafter, "suffix"), SuffixRequests)
    assert for_drafter(drafter, "ngram") is None
    assert for_drafter(SimpleNamespace(), "suffix") is None
