"""The link between two hosts stalls, then goes for good: one deployment.

The hosts are network + pid namespaces on this machine (``tests/two_hosts.py``)
that share this machine's ``/dev/shm`` (two containers with their own network
and ``--ipc=host``: vLLM's shared-memory test says "one node"); host 0 runs
``vllm serve --nnodes 2 --node-rank 0``, host 1 ``--node-rank 1 --headless``.

- The hosts connect at all: the peer watch listens on the loopback only when
  the ranks share a network namespace (``runner/health/placement.py``; before,
  the shared ``/dev/shm`` put each on its own loopback and start-up failed).
- A stall: with requests decoding, host 0's end of the link goes down for 8 s
  (no FIN, no reset) and comes back. Nothing ends; every request completes
  with the PP=1 tokens.
- A cut: with requests decoding, the link goes down for good. Each host's
  worker declares the other gone (``runner/health/keepalive.py``: 15 s
  without an answer), naming its rank and address, and both hosts end within
  30 s; every request in flight ends with an error.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.acceptance import K
from tests.engine_jobs import GREEDY_REQUESTS
from tests.netns import link_down
from tests.two_hosts import Pipeline, two_hosts
from vllm_ppspec.runner.health.keepalive import DEFAULT_KEEPALIVE_S, keepalive_bounds
from vllm_ppspec_tools.fixtures.server import (
    greedy_completion,
    metrics,
    openai_client,
    request_outcome,
    token_ids,
)
from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec
from vllm_ppspec_tools.fixtures.tiny_models import greedy_reference

pytestmark = pytest.mark.e2e

LONG = 200  # tokens of each long request: in flight through the stall
STALL_S = 8.0
SILENT_HOST_BOUND_S = 30.0  # issue 34: every other host's engine ends within it
SHM_OFF = "CPU SHM communicator disabled for group pp"
DECODING = "vllm-ppspec: 2 batches in flight"


@pytest.fixture(scope="module")
def hosts():
    with two_hosts("lf", shared_shm=True) as h:
        yield h


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_stalled_link_ends_nothing_and_a_cut_one_ends_both_hosts(
    hosts, models, pp1_greedy, tmp_path
):
    assert STALL_S <= keepalive_bounds(DEFAULT_KEEPALIVE_S)[0]
    target, _ = tiny_spec(models, "draft_random", K)
    want = pp1_greedy[target]  # before this test's engines start
    pipe = Pipeline(hosts, models, "draft_random", tmp_path)  # one token per step
    h0, h1 = hosts.nodes
    try:
        pipe.wait_ready()
        client = openai_client(pipe.base, timeout=180)
        long_prompts = [[5 + i, 6, 7] for i in range(8)]
        finished: set[int] = set()

        def long_one(i: int) -> list[int]:
            try:
                return token_ids(greedy_completion(client, "tiny", long_prompts[i], LONG))
            finally:
                finished.add(i)

        def short_one(r) -> list[int]:
            choice = greedy_completion(client, "tiny", r["prompt_token_ids"], r["max_tokens"])
            return token_ids(choice)

        # The stall, with requests decoding.
        pool = ThreadPoolExecutor(8 + len(GREEDY_REQUESTS))
        longs = [pool.submit(long_one, i) for i in range(8)]
        shorts = [pool.submit(short_one, r) for r in GREEDY_REQUESTS]
        _wait_for(lambda: DECODING in pipe.logs[0].read_text(), 120, "no decoding")
        link_down(h0.host)
        in_stall = set(range(8)) - finished
        time.sleep(STALL_S)
        h0.link_up()
        t_up = time.monotonic()
        got_long = [f.result(timeout=180) for f in longs]
        got_short = [f.result(timeout=60) for f in shorts]
        done_after = time.monotonic() - t_up
        assert in_stall, "every long request ended before the stall"
        assert got_short == want
        assert got_long == [greedy_reference(p, LONG) for p in long_prompts]
        assert pipe.health() == 200
        assert all(j.poll() is None for j in pipe.jobs)
        print(
            f"{STALL_S:.0f} s stall with {len(in_stall)} long requests in flight: survived, "
            f"all done {done_after:.1f} s after the link came back"
        )

        # The cut, with requests decoding.
        def outcome(i: int) -> str:
            return request_outcome(client, "tiny", [50 + i, 6, 7], LONG)

        gen = metrics(pipe.base)["vllm:generation_tokens_total"]
        futures = [pool.submit(outcome, i) for i in range(8)]

        def decoding() -> bool:
            m = metrics(pipe.base)
            return (
                m["vllm:num_requests_running"] >= 8 and m["vllm:generation_tokens_total"] > gen + 64
            )

        _wait_for(decoding, 120, "the second requests did not start decoding")
        t_cut = time.monotonic()
        link_down(h0.host)
        _wait_for(lambda: pipe.health() != 200, SILENT_HOST_BOUND_S, "/health 200 after 30 s")
        unhealthy_after = time.monotonic() - t_cut
        _wait_for(
            lambda: not (h0.vllm_pids() or h1.vllm_pids()),
            SILENT_HOST_BOUND_S - unhealthy_after,
            f"vLLM processes left on a host {SILENT_HOST_BOUND_S:.0f} s after the cut",
        )
        gone_after = time.monotonic() - t_cut
        results = [f.result(timeout=60) for f in futures]  # no hang
        pool.shutdown()
    finally:
        pipe.stop()
        h0.link_up()
    assert all(r != "completed" for r in results), results
    logs = [p.read_text() for p in pipe.logs]
    for r, log in enumerate(logs):
        assert SHM_OFF in log, f"host {r}: the PP group kept vLLM's SHM path"
    # Each host names the silent one: its rank and its peer watch's address.
    for r, (log, other) in enumerate(zip(logs, (h1.host, h0.host), strict=True)):
        named = f"PP rank {1 - r} at {other.addr}:"
        # by its missing beats (runner/health/heartbeat.py) or the keepalive, whichever first
        silent = "no heartbeat for" in log or "Connection timed out" in log
        assert named in log and silent, f"host {r}:\n{log[-3000:]}"
    assert unhealthy_after >= DEFAULT_KEEPALIVE_S - 2, "ended before the keepalive bound"
    print(
        f"link cut: /health not 200 after {unhealthy_after:.1f} s, both hosts empty after "
        f"{gone_after:.1f} s; requests: {results}"
    )
