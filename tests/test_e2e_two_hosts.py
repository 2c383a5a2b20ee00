"""PP across two hosts: ``vllm serve --nnodes 2``, one PP stage per host.

The hosts are network + pid namespaces on this machine (``tests/two_hosts.py``):
their own addresses, pids, ``/dev/shm`` and hostnames, joined by a veth pair.
Host 0 runs ``vllm serve ... --nnodes 2 --node-rank 0`` (API server, engine
core, PP rank 0); host 1 ``--node-rank 1 --headless`` (PP rank 1: the sampler
and the drafter). The client reaches host 0's API server over a second link.
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.acceptance import K, check_acceptance
from tests.engine_jobs import GREEDY_REQUESTS, job, run_job
from tests.netns import link_down
from tests.two_hosts import TwoHosts, two_hosts
from vllm_ppspec_tools.fixtures.server import (
    greedy_completion,
    openai_client,
    pp_spec_args,
    serve_args,
    token_ids,
)
from vllm_ppspec_tools.fixtures.spec_configs import ALIASES, tiny_spec

pytestmark = pytest.mark.e2e

MAX_MODEL_LEN = 512
API_PORT = 8000
MASTER_PORT = 29511
SHM_OFF = "CPU SHM communicator disabled for group pp"


def node_args(models, drafter: str, hosts: TwoHosts, rank: int, *extra: str) -> list[str]:
    target, spec = tiny_spec(models, drafter, K)
    args = [
        "vllm",
        "serve",
        *serve_args(models[target], "tiny", MAX_MODEL_LEN, *extra),
        *pp_spec_args(2, spec, worker_cls=False),
        "--nnodes", "2", "--node-rank", str(rank),
        "--master-addr", hosts.nodes[0].host.addr, "--master-port", str(MASTER_PORT),
    ]  # fmt: skip
    if rank == 0:
        return [*args, "--host", hosts.client_addr, "--port", str(API_PORT)]
    return [*args, "--headless"]


def node_env(hosts: TwoHosts, rank: int) -> dict[str, str]:
    """What each node needs (README, "Across hosts"): its own address for vLLM
    and gloo, and one OpenMP core list per local rank."""
    import os

    host = hosts.nodes[rank].host
    return {
        **os.environ,
        "VLLM_HOST_IP": host.addr,
        "GLOO_SOCKET_IFNAME": host.ifname,
        "VLLM_CPU_OMP_THREADS_BIND": str(rank % (os.cpu_count() or 1)),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }


class Pipeline:
    """The two nodes of one ``vllm serve --nnodes 2``."""

    def __init__(
        self,
        hosts: TwoHosts,
        models,
        drafter: str,
        tmp_path: Path,
        *extra: str,
        env: dict[int, dict[str, str]] | None = None,
        common: dict[str, str] | None = None,
    ):
        """``env``: extra environment per host rank; ``common``: for both."""
        self.hosts = hosts
        self.base = f"http://{hosts.client_addr}:{API_PORT}"
        self.logs = [tmp_path / f"host{r}.log" for r in (0, 1)]
        self.jobs = [
            node.start(
                node_args(models, drafter, hosts, r, *extra),
                self.logs[r],
                {**node_env(hosts, r), **(common or {}), **(env or {}).get(r, {})},
            )
            for r, node in enumerate(hosts.nodes)
        ]

    def wait_ready(self, timeout: float = 300) -> None:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r, j in enumerate(self.jobs):
                if j.poll() is not None:
                    raise RuntimeError(
                        f"host {r}'s vllm serve exited with {j.returncode}:\n"
                        + "\n".join(p.read_text()[-3000:] for p in self.logs)
                    )
            if self.health() == 200:
                return
            time.sleep(1)
        raise TimeoutError("\n".join(p.read_text()[-3000:] for p in self.logs))

    def health(self) -> int:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return -1

    def stop(self) -> None:
        for node, j in zip(self.hosts.nodes, self.jobs, strict=True):
            node.kill_job(j)


@pytest.fixture(scope="module")
def hosts():
    with two_hosts("e2e") as h:
        yield h


@pytest.fixture(scope="module")
def pp1_reference(models):
    """PP=1 without speculation, vLLM's own worker, one host: the oracle."""
    return {name: run_job(job(models[name], worker="stock")).outputs for name in ("target", "mimo")}


def metrics(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def spec_counts(base: str) -> dict[str, int]:
    m = metrics(base)
    return {
        "accepted": int(m["vllm:spec_decode_num_accepted_tokens_total"]),
        "drafts": int(m["vllm:spec_decode_num_draft_tokens_total"]),
    }


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
]


@pytest.mark.parametrize(("drafter", "mode"), CASES, ids=[f"{d}-{m}" for d, m in CASES])
def test_pp2_across_two_hosts_matches_pp1(hosts, models, pp1_reference, tmp_path, drafter, mode):
    target, _ = tiny_spec(models, drafter, K)
    extra = ["--async-scheduling"] if mode == "async" else []
    pipe = Pipeline(hosts, models, drafter, tmp_path, "--max-num-batched-tokens", "64", *extra)
    try:
        pipe.wait_ready()
        got = greedy_all(pipe.base)
        counts = spec_counts(pipe.base)
    finally:
        pipe.stop()
    assert got == pp1_reference[target]
    check_acceptance(ALIASES.get(drafter, drafter), counts)
    logs = [p.read_text() for p in pipe.logs]
    for r, log in enumerate(logs):
        # Across hosts vLLM's CPU communicator turns SHM off for the PP group:
        # pipeline transfers and the plugin's rounds share gloo's TCP path.
        assert SHM_OFF in log, f"host {r}: the PP group kept vLLM's SHM path"
        assert f"vllm-ppspec: PP rank {r}/2" in log, f"host {r}: the plugin's runner did not start"


MISMATCHES = {
    # host 1 alone keeps one batch in flight: a different protocol
    "switch": (
        {"VLLM_PPSPEC_ONE_BATCH": "1"},
        "$VLLM_PPSPEC_ONE_BATCH (rank 0: '<unset>', rank 1: '1')",
    ),
    # host 1 alone keeps vLLM's own worker (which fails there by itself)
    "no-plugin": ({"VLLM_PPSPEC_AUTO": "0"}, "did not reach the plugin's start-up check"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_hosts_started_differently_are_refused_on_both(hosts, models, tmp_path, case):
    """Each node builds its config from its own command line and environment:
    a difference is refused (runner/startup_check.py) and both hosts end
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
    log0 = pipe.logs[0].read_text()
    assert expected in log0, log0[-4000:]
    assert "vllm-ppspec: the PP ranks were started differently" in log0 or case == "no-plugin"
    print(f"{case}: both hosts ended {ended_after:.1f} s after start")
    while hosts.nodes[0].vllm_pids() or hosts.nodes[1].vllm_pids():
        assert time.monotonic() - start < 90, "vLLM processes left on a host"
        time.sleep(0.5)


def _worker_pid(log: str) -> int:
    """The host-local pid of the host's one worker, from its log lines."""
    return int(re.search(r"^\(Worker(?:_PP\d)? pid=(\d+)\)", log, re.M).group(1))


FAULTS = ["kill-worker-host0", "kill-worker-host1", "link-down", "kill-host1"]


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_across_hosts_fails_requests_and_ends_both_hosts(hosts, models, tmp_path, fault):
    """Each fault with 16 requests decoding (draft_random: one token per step):
    every request in flight ends with an error, ``/health`` stops answering
    200 within 10 s, and no vLLM process is left on either host after 30 s.
    ``kill-host1`` (SIGKILL of host 1's process 1: the kernel kills everything
    there) runs last: the hosts are not usable after it."""
    pipe = Pipeline(hosts, models, "draft_random", tmp_path)
    h0, h1 = hosts.nodes
    try:
        pipe.wait_ready()
        client = openai_client(pipe.base, timeout=90)
        finished: set[int] = set()

        def one(i: int) -> str:
            try:
                resp = client.completions.create(
                    model="tiny",
                    prompt=[5 + i, 6, 7],
                    max_tokens=MAX_MODEL_LEN - 8,
                    temperature=0.0,
                    extra_body={"ignore_eos": True},
                )
                finish = resp.choices[0].finish_reason
                return "completed" if finish == "length" else f"cut: {finish}"
            except Exception as e:  # noqa: BLE001 - the error is what we expect
                return f"error: {type(e).__name__}"
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
        elif fault == "link-down":
            link_down(h0.host)
        else:
            h1.kill_host()
        in_flight = set(range(16)) - finished
        while pipe.health() == 200:
            assert time.monotonic() - t_fault < 10, "/health still answers 200 after 10 s"
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
        if fault == "link-down":
            h0.link_up()
