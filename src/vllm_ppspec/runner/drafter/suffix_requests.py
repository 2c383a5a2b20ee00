"""Suffix decoding under PP: a request's suffix state lives until it finishes.

vLLM's ``SuffixDecodingProposer.propose`` (``vllm/v1/spec_decode/suffix_decoding.py``)
ends, in its suffix cache, every active request missing from the step's input
batch. The plugin fills the pipeline with one batch per stage, so a request
sits out all but one of every PP steps; the proposer would end it each time
and start it again from its prompt, dropping the response it had seen. Here,
while ``propose`` runs, the cache ends no request; a request ends when the
scheduler reports it finished (``finished_req_ids``). Preempted requests keep
their state: they resume where they stopped.

Last PP rank only, method ``suffix`` only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any


class SuffixRequests:
    """Who ends requests in a suffix drafter's cache (``drafter.suffix_cache``)."""

    def __init__(self, suffix_cache: Any) -> None:
        self._cache = suffix_cache

    @contextmanager
    def proposing(self) -> Iterator[None]:
        """While the drafter proposes, its cache ends no request."""
        self._cache.stop_request = _keep
        try:
            yield
        finally:
            del self._cache.stop_request  # the class's method again

    def finished(self, req_ids: Iterable[str]) -> None:
        """End the finished requests the cache still holds as active."""
        active = self._cache.active_requests
        for req_id in req_ids:
            if req_id in active:
                self._cache.stop_request(req_id)


def _keep(req_id: str) -> None:
    """Stand-in for the cache's ``stop_request`` while the drafter proposes."""


def for_drafter(drafter: Any, method: str) -> SuffixRequests | None:
    """A :class:`SuffixRequests` for a suffix drafter, else None."""
    cache = getattr(drafter, "suffix_cache", None)
    return SuffixRequests(cache) if method == "suffix" and cache is not None else None
