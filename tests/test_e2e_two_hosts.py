"""PP across two hosts: ``vllm serve --nnodes 2``, one PP stage per host.

The hosts are network + pid namespaces on this machine (``hosts/two_hosts.py``):
their own addresses, pids, ``/dev/shm`` and hostnames, joined by a veth pair.
Host 0 runs ``vllm serve ... --nnodes 2 --node-rank 0`` (API server, engine
core, PP rank 0); host 1 ``--node-rank 1 --headless`` (PP rank 1: the sampler
and the drafter). The client reaches host 0's API server over a second link.
A second network joins the hosts for gloo (``gloo_link``): ``VLLM_HOST_IP`` is
each host's address on the first, ``GLOO_SOCKET_IFNAME`` names its interface
on the second, and the peer watch must listen on gloo's (the PP data's path):
a frozen host is named at that address by the other.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.acceptance import K, check_acceptance, check_hybrid_acceptance
from tests.engine_jobs import GREEDY_REQUESTS
from tests.references import HYBRID_REQUESTS
from tests.test_e2e_hybrid import judge
from tests.two_hosts import Pipeline, two_hosts
from vllm_ppspec_tools.fixtures import forkserver
from vllm_ppspec_tools.fixtures.server import (
    ALL_STOPS,
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
from vllm_ppspec_tools.fixtures.spec_configs import ALIASES, tiny_spec
from vllm_ppspec_tools.fixtures.tiny_models import greedy_reference

pytestmark = pytest.mark.e2e

MAX_MODEL_LEN = 512
SHM_OFF = "CPU SHM communicator disabled for group pp"


@pytest.fixture(scope="module")
def hosts():
    with two_hosts("e2e", gloo_link=True) as h:
        assert all(n.gloo_host.addr != n.host.addr for n in h.nodes)
        yield h


def spec_counts(base: str) -> dict[str, int]:
    m = metrics(base)
    return {
        "accepted": int(m["vllm:spec_decode_num_accepted_tokens_total"]),
        "drafts": int(m["vllm:spec_decode_num_draft_tokens_total"]),
    }


def _ppid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("PPid:")).split()[1])


def test_each_host_is_a_fork_of_the_tests_fork_server_in_namespaces_of_its_own(hosts, tmp_path):
    """A host starts without a new interpreter: its process 1 is the child of a
    job of the tests' fork server (vLLM imported). What its fork server forks
    sees the host's own network namespace (its interfaces in ``/sys``), pid
    namespace, hostname and ``/dev/shm``, as ``ip netns exec`` + ``unshare``
    gave it."""
    seen = []
    for node in hosts.nodes:
        assert _ppid(node.init_pid()) == node.launcher.pid
        assert _ppid(node.launcher.pid) == forkserver._SERVER._proc.pid
        log = tmp_path / f"probe-{node.rank}.log"
        job = node.server.start("tests.host_probe", ["host_probe"], str(log), dict(os.environ))
        assert job.wait(60) == 0, log.read_text()
        seen.append(json.loads(log.read_text().splitlines()[-1]))
    root = {k: os.readlink(f"/proc/self/ns/{k}") for k in ("net", "pid")}
    for node, s in zip(hosts.nodes, seen, strict=True):
        assert s["hostname"] == f"ppspec-host{node.rank}", s
        assert {node.host.ifname, node.gloo_host.ifname} <= set(s["interfaces"]), s
        assert s["net_ns"] != root["net"] and s["pid_ns"] != root["pid"], s
        assert s["pid"] < 100, s  # a pid of the host's own namespace
    assert len({s["net_ns"] for s in seen} | {s["pid_ns"] for s in seen}) == 4, seen
    assert len({s["shm_dev"] for s in seen} | {os.stat("/dev/shm").st_dev}) == 3, seen


def greedy_all(base: str) -> list[list[int]]:
    """Every request of GREEDY_REQUESTS at once (several in flight)."""
    client = openai_client(base, timeout=120)

    def one(r):
        return token_ids(greedy_completion(client, "tiny", r["prompt_token_ids"], r["max_tokens"]))

    with ThreadPoolExecutor(len(GREEDY_REQUESTS)) as pool:
        return list(pool.map(one, GREEDY_REQUESTS))


CASES = [
    ("draft_copy", "sync"),
    ("draft_copy", "async"),
    ("eagle3", "sync"),
    ("eagle3", "async"),
    ("mtp", "sync"),
    ("mtp", "async"),
    ("ngram", "sync"),
    # VLLM_PPSPEC_DRAFTER_STAGE=first on both hosts (sync): host 0 drafts, the
    # drafts cross the link in the intermediate tensors, host 1 verifies them.
    # Each host's vllm serve starts in a new interpreter, as a user's shell
    # starts it (vLLM's own start method and garbage collection).
    ("draft_copy", "first"),
]


@pytest.mark.parametrize(("drafter", "mode"), CASES, ids=[f"{d}-{m}" for d, m in CASES])
def test_pp2_across_two_hosts_matches_pp1(hosts, models, pp1_greedy, tmp_path, drafter, mode):
    target, _ = tiny_spec(models, drafter, K)
    want = pp1_greedy[target]  # before this test's engines start
    extra = ["--async-scheduling"] if mode == "async" else []
    first = {"VLLM_PPSPEC_DRAFTER_STAGE": "first"} if mode == "first" else {}
    fresh = mode == "first"
    pipe = Pipeline(
        hosts,
        models,
        drafter,
        tmp_path,
        "--max-num-batched-tokens",
        "64",
        *extra,
        common=first,
        fresh=fresh,
    )
    try:
        pipe.wait_ready()
        got = greedy_all(pipe.base)
        counts = spec_counts(pipe.base)
        cmdlines = [
            Path(f"/proc/{node.root_pid(job.pid)}/cmdline").read_bytes()
            for node, job in zip(hosts.nodes, pipe.jobs, strict=True)
        ]
    finally:
        pipe.stop()
    assert got == want
    check_acceptance(ALIASES.get(drafter, drafter), counts)
    logs = [p.read_text() for p in pipe.logs]
    for r, log in enumerate(logs):
        # Across hosts vLLM's CPU communicator turns SHM off for the PP group:
        # pipeline transfers and the plugin's rounds share gloo's TCP path.
        assert SHM_OFF in log, f"host {r}: the PP group kept vLLM's SHM path"
        assert f"vllm-ppspec: PP rank {r}/2" in log, f"host {r}: the plugin's runner did not start"
    on_first = "the draft model runs on the first PP stage"
    assert (on_first in logs[0]) == (mode == "first"), logs[0][-4000:]
    # Each host's API server process: the vllm executable (a new interpreter) or
    # a child of the host's fork server.
    assert [b"/vllm\x00serve\x00" in c for c in cmdlines] == [fresh, fresh], cmdlines


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_hybrid_mtp_across_two_hosts_follows_pp1(hosts, models, hybrid, hybrid_pp1, tmp_path, mode):
    """Qwen3-Next (GDN) + MTP across the hosts: each host keeps its stage's
    recurrent state from the rounds it learns (sync: the scheduler output;
    async: the round message over the link)."""
    want = hybrid_pp1("hybrid_copy")  # before this test's engines start
    spec = {"method": "mtp", "num_speculative_tokens": K}
    extra = ["--dtype", "bfloat16", "--no-enable-prefix-caching", "--max-num-seqs", "4"]
    extra += ["--async-scheduling"] if mode == "async" else []
    pipe = Pipeline(hosts, models, (hybrid["hybrid_copy"], spec), tmp_path, *extra)
    try:
        pipe.wait_ready()
        client = openai_client(pipe.base, timeout=120)

        def one(r):
            choice = greedy_completion(client, "tiny", r["prompt_token_ids"], r["max_tokens"])
            return token_ids(choice)

        with ThreadPoolExecutor(len(HYBRID_REQUESTS)) as pool:
            outputs = list(pool.map(one, HYBRID_REQUESTS))
        counts = spec_counts(pipe.base)
    finally:
        pipe.stop()
    forgiven, failures = judge(want, outputs)
    assert not failures, f"divergence at a clear margin (request, position, gap): {failures}"
    print(f"forgiven near-tie divergences: {forgiven}; spec {counts}")
    check_hybrid_acceptance(counts, HYBRID_REQUESTS)
    for r, log in enumerate(p.read_text() for p in pipe.logs):
        assert SHM_OFF in log, f"host {r}: the PP group kept vLLM's SHM path"


MISMATCHES = {
    # host 1 alone keeps one batch in flight: a switch the ranks must agree on
    # (runner/health/startup_check.AGREED_SWITCHES; host 0's unset reads as its default)
    "switch": (
        {"VLLM_PPSPEC_ONE_BATCH": "1"},
        "$VLLM_PPSPEC_ONE_BATCH (rank 0: '0', rank 1: '1')",
    ),
    # host 1 alone runs the draft model on the first stage: the plan's decision,
    # compared by its setting (choice/plan.Plan.agreed), each host named
    "drafter-stage": (
        {"VLLM_PPSPEC_DRAFTER_STAGE": "first"},
        "drafter stage ($VLLM_PPSPEC_DRAFTER_STAGE) (rank 0: 'last', rank 1: 'first')",
    ),
    # host 1 alone keeps vLLM's own worker: the deployment check of every worker
    # (patches/config/deployment_check.py) names the decision and the setting, at once
    "no-plugin": (
        {"VLLM_PPSPEC_AUTO": "0"},
        "$VLLM_PPSPEC_AUTO (rank 0: '<unset>', rank 1: '0')",
    ),
}
REFUSALS = {
    "switch": "vllm-ppspec: the PP ranks were started differently",
    "drafter-stage": "vllm-ppspec: the PP ranks were started differently",
    "no-plugin": "vllm-ppspec: the ranks of this deployment decided differently who serves",
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_hosts_started_differently_are_refused_on_both(hosts, models, tmp_path, case):
    """Each node builds its config from its own command line and environment:
    a difference is refused (runner/health/startup_check.py) and both hosts end
    within seconds, host 0 naming what differs."""
    env1, expected = MISMATCHES[case]
    pipe = Pipeline(
        hosts,
        models,
        "draft_copy",
        tmp_path,
        env={1: env1},
        common={"VLLM_PPSPEC_STARTUP_TIMEOUT": "10"},
    )
    try:
        start = time.monotonic()
        for job in pipe.jobs:
            job.wait(timeout=60)
        ended_after = time.monotonic() - start
    finally:
        pipe.stop()
    assert all(j.returncode != 0 for j in pipe.jobs), [j.returncode for j in pipe.jobs]
    for r, log in enumerate(p.read_text() for p in pipe.logs):
        # Every host names what differs; neither waited out the start-up timeout.
        assert expected in log and REFUSALS[case] in log, (r, log[-4000:])
        assert "did not reach" not in log, (r, log[-4000:])
        if case != "no-plugin":  # the PP ranks' check names each rank's host
            named = log.split("Hosts: ")[1].splitlines()[0]
            assert "rank 0: ppspec-host0" in named and "rank 1: ppspec-host1" in named, named
    print(f"{case}: both hosts ended {ended_after:.1f} s after start")
    while hosts.nodes[0].vllm_pids() or hosts.nodes[1].vllm_pids():
        assert time.monotonic() - start < 90, "vLLM processes left on a host"
        time.sleep(0.5)


GOODBYE_LINE = (
    "vllm-ppspec: PP rank 0 stopped in order (it said goodbye): "
    "stopping this node's vLLM (PP rank 1)"
)


@pytest.mark.parametrize(("sig", "mode"), ALL_STOPS, ids=[f"{s}-{m}" for s, m in ALL_STOPS])
def test_an_orderly_stop_of_the_leader_ends_both_hosts_quietly(hosts, models, tmp_path, sig, mode):
    """Host 0's ``vllm serve``, idle after one request, gets SIGINT on its
    process group (a Ctrl-C) or SIGTERM on its main process at vLLM's default
    ``--shutdown-timeout 0`` (its engine core gets the window to stop its
    workers in order: patches/config/stop_grace.py): its worker says goodbye, host
    1's worker logs one INFO line and stops its headless ``vllm serve`` as
    SIGTERM would. Every process of both hosts is
    gone within 15 s, both exit with vLLM's own status, and neither log has an
    error or a traceback but host 0's API server's own."""
    pipe = Pipeline(hosts, models, "draft_copy", tmp_path, *stop_args(sig, mode))
    h0, h1 = hosts.nodes
    try:
        pipe.wait_ready()
        client = openai_client(pipe.base, timeout=60)
        prompt = [5, 6, 7]
        got = token_ids(greedy_completion(client, "tiny", prompt, 16))
        assert got == greedy_reference(prompt, 16)
        time.sleep(1.0)  # idle
        t_stop = time.monotonic()
        send_stop(h0.root_pid(pipe.jobs[0].pid), sig)
        while h0.vllm_pids() or h1.vllm_pids():
            left = {0: h0.vllm_pids(), 1: h1.vllm_pids()}
            assert time.monotonic() - t_stop < STOP_BOUND_S, f"left after 15 s: {left}"
            time.sleep(0.1)
        gone_after = time.monotonic() - t_stop
        codes = [job.wait(timeout=5) for job in pipe.jobs]
    finally:
        pipe.stop()
    logs = [p.read_text() for p in pipe.logs]
    assert codes == [VLLM_STOP_STATUS, VLLM_STOP_STATUS], codes
    for r, log in enumerate(logs):
        assert stop_noise(log) == [], f"host {r}:\n" + "\n".join(stop_noise(log)[:60])
    said = [line for line in logs[1].splitlines() if GOODBYE_LINE in line]
    assert len(said) == 1 and " INFO " in said[0], said
    assert GOODBYE_LINE not in logs[0]
    # Host 1 ended through vLLM's own shutdown of a headless node.
    assert "[shutdown] Executor: all workers exited gracefully" in logs[1]
    print(f"{sig}-{mode}: both hosts empty {gone_after:.1f} s after the signal")


def _worker_pid(log: str) -> int:
    """The host-local pid of the host's one worker, from its log lines."""
    return int(re.search(r"^\(Worker(?:_PP\d)? pid=(\d+)\)", log, re.M).group(1))


# The link cut for good (no FIN, no reset): tests/test_e2e_link_faults.py, whose
# bound is the peer watch's keepalive (15 s) and 30 s, after an 8 s stall.
FAULTS = [
    "kill-worker-host0",
    "kill-worker-host1",
    "stop-worker-host0",
    "stop-worker-host1",
    "kill-host1",
]
# A killed process is seen at once (its kernel closes its sockets): 10 s. A
# stopped one (SIGSTOP: its kernel still answers TCP) by its missing beats,
# runner/health/heartbeat.py: VLLM_PPSPEC_PEER_KEEPALIVE_S (15 s), within 30 s.
HEALTH_BOUND_S = {"stop-worker-host0": 30.0, "stop-worker-host1": 30.0}
GUARDIAN_LINE = "has not run for"


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_across_hosts_fails_requests_and_ends_both_hosts(hosts, models, tmp_path, fault):
    """Each fault with 16 requests decoding (draft_random: one token per step):
    every request in flight ends with an error, ``/health`` stops answering
    200 within 10 s (30 s for a stopped worker), and no vLLM process is left
    on either host after 30 s. ``stop-worker-host*``: SIGSTOP of a host's
    worker (frozen; its kernel keeps its connections): the other host's
    worker declares it gone by its missing heartbeat, naming it, and its own
    guardian SIGKILLs it, so that its host ends too. ``kill-host1`` (SIGKILL
    of host 1's process 1: the kernel kills everything there) runs last: the
    hosts are not usable after it."""
    pipe = Pipeline(hosts, models, "draft_random", tmp_path)
    h0, h1 = hosts.nodes
    try:
        pipe.wait_ready()
        client = openai_client(pipe.base, timeout=90)
        finished: set[int] = set()

        def one(i: int) -> str:
            try:
                return request_outcome(client, "tiny", [5 + i, 6, 7], MAX_MODEL_LEN - 8)
            finally:
                finished.add(i)

        pool = ThreadPoolExecutor(16)
        futures = [pool.submit(one, i) for i in range(16)]
        flag = "vllm-ppspec: 2 batches in flight"
        deadline = time.monotonic() + 120
        while flag not in pipe.logs[0].read_text():
            assert time.monotonic() < deadline, "requests did not start decoding"
            time.sleep(0.05)
        t_fault = time.monotonic()
        if fault == "kill-worker-host0":
            os.kill(h0.root_pid(_worker_pid(pipe.logs[0].read_text())), signal.SIGKILL)
        elif fault == "kill-worker-host1":
            os.kill(h1.root_pid(_worker_pid(pipe.logs[1].read_text())), signal.SIGKILL)
        elif fault.startswith("stop-worker-host"):
            r = int(fault[-1])
            os.kill(hosts.nodes[r].root_pid(_worker_pid(pipe.logs[r].read_text())), signal.SIGSTOP)
        else:
            h1.kill_host()
        in_flight = set(range(16)) - finished
        bound = HEALTH_BOUND_S.get(fault, 10.0)
        while pipe.health() == 200:
            assert time.monotonic() - t_fault < bound, f"/health still 200 after {bound:.0f} s"
            time.sleep(0.2)
        unhealthy_after = time.monotonic() - t_fault
        results = [f.result(timeout=60) for f in futures]  # no hang
        pool.shutdown()
        assert all(results[i] != "completed" for i in in_flight), (in_flight, results)
        assert sum(r != "completed" for r in results) >= 8, results
        while h0.vllm_pids() or h1.vllm_pids():
            left = {0: h0.vllm_pids(), 1: h1.vllm_pids()}
            assert time.monotonic() - t_fault < 30, f"left after 30 s: {left}"
            time.sleep(0.5)
        gone_after = time.monotonic() - t_fault
        print(
            f"{fault}: /health not 200 after {unhealthy_after:.1f} s, both hosts empty "
            f"after {gone_after:.1f} s; requests: {results}"
        )
    finally:
        pipe.stop()
    if fault.startswith("stop-worker-host"):
        r = int(fault[-1])
        logs = [p.read_text() for p in pipe.logs]
        # The other host names the frozen one by its beats, at the address its
        # peer watch listens on: gloo's interface's, not VLLM_HOST_IP's.
        other, frozen = logs[1 - r], hosts.nodes[r]
        named = f"PP rank {r} at {frozen.gloo_host.addr}:"
        assert named in other and "no heartbeat for" in other, other[-3000:]
        assert f"PP rank {r} at {frozen.host.addr}:" not in other, other[-3000:]
        # The frozen host's guardian ended its worker.
        assert GUARDIAN_LINE in logs[r], logs[r][-3000:]
