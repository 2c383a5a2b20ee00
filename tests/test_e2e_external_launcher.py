"""End to end: PP + speculative decoding with the external launcher (torchrun:
one process and one engine per rank, as RL frameworks drive vLLM), with no
``--worker-cls``.

Two processes on this machine, PP=2 over gloo, each with the environment
torchrun gives its rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and its
own ``vllm.LLM(..., distributed_executor_backend="external_launcher")``. Each
rank's engine must learn the last rank's sampled tokens and drafts every step
(runner/steps/external.py): both ranks return the same tokens, equal to PP=1
without speculation, and both engines count the acceptance the drafter was
planted for.
"""

from __future__ import annotations

import glob
import os
import socket

import pytest

from tests.acceptance import check_acceptance
from tests.engine_jobs import job
from vllm_ppspec_tools.fixtures.jobs import run_jobs_together
from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec

pytestmark = pytest.mark.e2e

K = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


STALE_SHM = "/dev/shm/-pp:0-*-cpushm_*"


def _clear_stale_shm() -> None:
    """vLLM's CPU worker names the PP group's shared-memory segments after the
    init method, "env://" under the external launcher: one fixed name for every
    deployment. Without the plugin's worker it outlives the engine (vLLM 0.32's
    own worker too), and the next deployment on this machine fails with "create
    shm in SHMManager failed. errno: 17"; the plugin's CPU worker removes the
    names once mapped (patches/worker/cpu_shm_names.py). A name left by an
    earlier engine without the plugin is removed before each deployment."""
    for path in glob.glob(STALE_SHM):
        os.unlink(path)


def _ranks(model: str, spec: dict) -> list[dict]:
    _clear_stale_shm()
    port = _free_port()
    ranks = []
    for rank in range(2):
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "VLLM_CPU_OMP_THREADS_BIND": str(rank % (os.cpu_count() or 1)),
        }
        ranks.append(
            job(model, pp=2, spec=spec, worker="auto", executor="external_launcher", env=env)
        )
    return ranks


@pytest.mark.parametrize("method", ["draft_copy", "eagle3"])
def test_external_launcher_ranks_agree_and_match_pp1(models, pp1_greedy, method):
    target, spec = tiny_spec(models, method, K)
    results = run_jobs_together(_ranks(models[target], spec), timeout=400)
    for rank, res in enumerate(results):
        assert res.returncode == 0, f"rank {rank}:\n" + res.log[-8000:]
        said = f"speculative method {spec['method']}, k={K}, external launcher scheduling"
        assert said in res.log, f"rank {rank} did not log {said!r}"
        assert res.outputs == pp1_greedy[target], f"rank {rank}"
        check_acceptance(method, res.result["spec"])
    assert results[0].result["spec"] == results[1].result["spec"]
    assert glob.glob(STALE_SHM) == [], "the deployment left its shared-memory names"


def test_external_launcher_with_async_scheduling_is_refused_naming_why(models):
    target, spec = tiny_spec(models, "draft_copy", K)
    ranks = _ranks(models[target], spec)
    for one in ranks:
        one["async_scheduling"] = True
    for rank, res in enumerate(run_jobs_together(ranks, timeout=120)):
        assert res.returncode != 0, f"rank {rank} started"
        assert "async scheduling with the external_launcher PP mode under vllm-ppspec" in (
            res.log
        ), res.log[-4000:]
