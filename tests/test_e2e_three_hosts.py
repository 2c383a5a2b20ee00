"""PP=3 across three hosts: ``vllm serve --nnodes 3``, one PP stage per host.

The hosts are network + pid namespaces on this machine joined by a bridge
(``vllm_ppspec_tools.hosts``: ``pp_hosts(tag, 3)``), each with its own
addresses, pids, ``/dev/shm`` and hostname. Host 0 runs ``vllm serve ...
--nnodes 3 --node-rank 0`` (API server, engine core, PP rank 0); hosts 1 and
2 ``--node-rank 1`` / ``2 --headless``: the middle stage has a peer on each
side on other hosts, the last holds the sampler and the drafter. A second
network (a second bridge) joins the hosts for gloo (``gloo_link``):
``VLLM_HOST_IP`` is on the first, ``GLOO_SOCKET_IFNAME`` names the second, and
the peer watch listens on gloo's address.

Two deployments, each checked twice (CI time: two start-ups in all):

- sync scheduling, the draft model on the first stage (host 0;
  ``VLLM_PPSPEC_DRAFTER_STAGE=first`` on every host): the drafts ride with the
  intermediate tensors through the middle host to the last; greedy tokens
  equal PP=1 and the copy drafter is accepted as planted, then a SIGKILL of
  the middle host's worker with requests decoding ends the engine on every
  host within 10 s, and the middle host is named at its gloo address by its
  peers;
- async scheduling: greedy tokens equal PP=1, then a Ctrl-C of host 0's
  ``vllm serve`` (SIGINT to its process group) empties all three hosts within
  15 s, each exiting with vLLM's own status, no error line in any log, each
  headless host stopping on a goodbye.
"""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.acceptance import K, check_acceptance
from tests.engine_jobs import GREEDY_REQUESTS
from vllm_ppspec_tools.fixtures.server import (
    STOP_BOUND_S,
    VLLM_STOP_STATUS,
    greedy_completion,
    metrics,
    openai_client,
    request_outcome,
    send_stop,
    stop_args,
    stop_noise,
    token_ids,
)
from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec
from vllm_ppspec_tools.hosts.two_hosts import Hosts, Pipeline, pp_hosts

pytestmark = pytest.mark.e2e

PP = 3
FIRST = {"VLLM_PPSPEC_DRAFTER_STAGE": "first"}
ON_FIRST = "the draft model runs on the first PP stage"
DRAFTER = "draft_copy"
MAX_MODEL_LEN = 512
KILL_BOUND_S = 10.0  # issue 34: a killed worker ends the engine on every host within it
SHM_OFF = "CPU SHM communicator disabled for group pp"
GOODBYE = re.compile(
    r"vllm-ppspec: PP rank (\d) stopped in order \(it said goodbye\): "
    r"stopping this node's vLLM \(PP rank (\d)\)"
)


@pytest.fixture(scope="module")
def hosts():
    with pp_hosts("e3", PP, gloo_link=True) as h:
        assert all(n.gloo_host.addr != n.host.addr for n in h.nodes)
        yield h


def greedy_all(base: str) -> list[list[int]]:
    """Every request of GREEDY_REQUESTS at once (several in flight)."""
    client = openai_client(base, timeout=120)

    def one(r):
        return token_ids(greedy_completion(client, "tiny", r["prompt_token_ids"], r["max_tokens"]))

    with ThreadPoolExecutor(len(GREEDY_REQUESTS)) as pool:
        return list(pool.map(one, GREEDY_REQUESTS))


def spec_counts(base: str) -> dict[str, int]:
    m = metrics(base)
    return {
        "accepted": int(m["vllm:spec_decode_num_accepted_tokens_total"]),
        "drafts": int(m["vllm:spec_decode_num_draft_tokens_total"]),
    }


def any_vllm(hosts: Hosts) -> dict[int, list[int]]:
    """Each host's vLLM processes, for hosts that still have some."""
    return {r: p for r, node in enumerate(hosts.nodes) if (p := node.vllm_pids())}


def check_pipeline_logs(logs: list[str]) -> None:
    for r, log in enumerate(logs):
        # Across hosts vLLM's CPU communicator turns SHM off for the PP group.
        assert SHM_OFF in log, f"host {r}: the PP group kept vLLM's SHM path"
        assert f"vllm-ppspec: PP rank {r}/{PP}" in log, (
            f"host {r}: the plugin's runner did not start"
        )


def test_pp3_sync_across_three_hosts_matches_pp1_then_a_killed_middle_worker_ends_every_host(
    hosts, models, pp1_greedy, tmp_path
):
    """Sync scheduling, the drafter on host 0: tokens equal PP=1; then, with 16 requests decoding,
    SIGKILL of host 1's worker (PP rank 1): its peers on hosts 0 and 2 read
    its connection's end, every request in flight fails, and no vLLM process
    is left on any host within 10 s."""
    target, _ = tiny_spec(models, DRAFTER, K)
    want = pp1_greedy[target]  # before this test's engines start
    pipe = Pipeline(hosts, models, DRAFTER, tmp_path, common=FIRST)  # sync scheduling
    middle = hosts.nodes[1]
    try:
        pipe.wait_ready()
        got = greedy_all(pipe.base)
        counts = spec_counts(pipe.base)
        client = openai_client(pipe.base, timeout=90)
        finished: set[int] = set()

        def one(i: int) -> str:
            try:
                return request_outcome(client, "tiny", [5 + i, 6, 7], MAX_MODEL_LEN - 8)
            finally:
                finished.add(i)

        gen = metrics(pipe.base)["vllm:generation_tokens_total"]
        pool = ThreadPoolExecutor(16)
        futures = [pool.submit(one, i) for i in range(16)]
        deadline = time.monotonic() + 120
        while True:
            m = metrics(pipe.base)
            if m["vllm:num_requests_running"] >= 8 and m["vllm:generation_tokens_total"] > gen + 64:
                break
            assert time.monotonic() < deadline, "requests did not start decoding"
            time.sleep(0.05)
        worker = re.search(r"^\(Worker(?:_PP\d)? pid=(\d+)\)", pipe.logs[1].read_text(), re.M)
        assert worker is not None, "no worker line in host 1's log"
        t_kill = time.monotonic()
        os.kill(middle.root_pid(int(worker.group(1))), signal.SIGKILL)
        in_flight = set(range(16)) - finished
        while pipe.health() == 200:
            assert time.monotonic() - t_kill < KILL_BOUND_S, "/health still 200 after 10 s"
            time.sleep(0.1)
        unhealthy_after = time.monotonic() - t_kill
        while left := any_vllm(hosts):
            assert time.monotonic() - t_kill < KILL_BOUND_S, f"left after 10 s: {left}"
            time.sleep(0.1)
        gone_after = time.monotonic() - t_kill
        results = [f.result(timeout=60) for f in futures]  # no hang
        pool.shutdown()
    finally:
        pipe.stop()
    assert got == want
    check_acceptance(DRAFTER, counts)
    check_pipeline_logs([p.read_text() for p in pipe.logs])
    assert [ON_FIRST in p.read_text() for p in pipe.logs] == [True, False, False]
    assert in_flight and all(results[i] != "completed" for i in in_flight), (in_flight, results)
    # Its peers' watches name the killed rank at the address its watch listened
    # on: gloo's interface's (the PP data's path), not VLLM_HOST_IP's.
    logs = [p.read_text() for p in pipe.logs]
    on_gloo, on_host_ip = (f"PP rank 1 at {a}:" for a in (middle.gloo_host.addr, middle.host.addr))
    assert any(on_gloo in logs[r] for r in (0, 2)), "\n".join(log[-2000:] for log in logs)
    assert not any(on_host_ip in log for log in logs), "named at VLLM_HOST_IP's address"
    print(
        f"SIGKILL of the middle host's worker: /health not 200 after {unhealthy_after:.1f} s, "
        f"all three hosts empty after {gone_after:.1f} s; requests: {results}"
    )


def test_pp3_async_across_three_hosts_matches_pp1_then_ctrl_c_of_node0_empties_every_host_quietly(
    hosts, models, pp1_greedy, tmp_path
):
    """Async scheduling: tokens equal PP=1; then, idle, a Ctrl-C of host 0's
    ``vllm serve`` (SIGINT to its process group): its worker says goodbye to
    both peers, each headless host logs the goodbye once and stops its own
    ``vllm serve`` as SIGTERM would. All three hosts are empty within 15 s,
    every ``vllm serve`` exits with vLLM's own status, no log has an error
    line or a traceback (``stop_noise``)."""
    target, _ = tiny_spec(models, DRAFTER, K)
    want = pp1_greedy[target]  # before this test's engines start
    pipe = Pipeline(hosts, models, DRAFTER, tmp_path, *stop_args("SIGINT", "async"))
    try:
        pipe.wait_ready()
        got = greedy_all(pipe.base)
        counts = spec_counts(pipe.base)
        time.sleep(1.0)  # idle
        t_stop = time.monotonic()
        send_stop(hosts.nodes[0].root_pid(pipe.jobs[0].pid), "SIGINT")
        while left := any_vllm(hosts):
            assert time.monotonic() - t_stop < STOP_BOUND_S, f"left after 15 s: {left}"
            time.sleep(0.1)
        gone_after = time.monotonic() - t_stop
        codes = [job.wait(timeout=5) for job in pipe.jobs]
    finally:
        pipe.stop()
    assert got == want
    check_acceptance(DRAFTER, counts)
    logs = [p.read_text() for p in pipe.logs]
    check_pipeline_logs(logs)
    assert codes == [VLLM_STOP_STATUS] * PP, codes
    for r, log in enumerate(logs):
        assert stop_noise(log) == [], f"host {r}:\n" + "\n".join(stop_noise(log)[:60])
    assert not GOODBYE.search(logs[0])
    for r in (1, 2):
        said = [(line, m) for line in logs[r].splitlines() if (m := GOODBYE.search(line))]
        assert len(said) == 1 and " INFO " in said[0][0], (r, said)
        assert int(said[0][1].group(2)) == r and int(said[0][1].group(1)) < r, said
        assert "[shutdown] Executor: all workers exited gracefully" in logs[r], r
    print(f"Ctrl-C of node 0 (async): all three hosts empty {gone_after:.1f} s after the signal")
