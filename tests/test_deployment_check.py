"""Every rank of a deployment serves the same way (``patches/config/deployment_check.py``):
ranks (hosts, DP replicas) that decided differently who serves are refused on
every rank within seconds, naming the decision and the setting that differ; the
same decision from different settings agrees; vLLM's release is compared
without its local label. Plain gloo ranks; the two-host case is in
tests/test_e2e_two_hosts.py."""

from __future__ import annotations

import functools
import os
import time
from types import SimpleNamespace

from tests.distributed import run_ranks
from vllm_ppspec import WORKER_QUALNAME
from vllm_ppspec.patches.config.deployment_check import DeploymentMismatchError, check, verdict

CPU_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"


def _config(worker: str, v2: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            worker_cls=worker, pipeline_parallel_size=2, data_parallel_size=1
        ),
        speculative_config=SimpleNamespace(method="draft_model"),
        use_v2_model_runner=v2,
    )


def _rank(per_rank: dict[int, tuple[str, str, dict[str, str]]], rank: int, world: int) -> str:
    import torch.distributed as dist

    worker, mode, env = per_rank[rank]
    os.environ.update(env)
    start = time.monotonic()
    try:
        check(_config(worker), dist.group.WORLD, mode)
    except DeploymentMismatchError as e:
        return f"refused after {time.monotonic() - start:.1f} s: {e}"
    return "agreed"


def _run(per_rank):
    return run_ranks(functools.partial(_rank, per_rank), world=len(per_rank), timeout=60)


def test_a_host_that_kept_vllms_worker_is_refused_on_every_rank_naming_the_setting():
    per_rank = {
        0: (WORKER_QUALNAME, "sync", {}),
        1: (CPU_WORKER, "off", {"VLLM_PPSPEC_AUTO": "0"}),
    }
    results = _run(per_rank)
    for r in results:
        msg = str(r.value)
        assert r.error is None and msg.startswith("refused"), (r.rank, r.message)
        assert f"worker (rank 0: '{WORKER_QUALNAME}', rank 1: '{CPU_WORKER}')" in msg, msg
        assert "mode (rank 0: 'sync', rank 1: 'off')" in msg, msg
        assert "$VLLM_PPSPEC_AUTO (rank 0: '<unset>', rank 1: '0')" in msg, msg
        assert float(msg.split()[2]) < 5.0, msg  # at once, not after a timeout


def test_the_same_decision_from_different_settings_agrees():
    per_rank = {
        0: (WORKER_QUALNAME, "sync", {"VLLM_PPSPEC_AUTO": "1"}),
        1: (WORKER_QUALNAME, "sync", {"VLLM_PPSPEC_AUTO": "yes"}),
    }
    assert [r.value for r in _run(per_rank)] == ["agreed", "agreed"]


def _decision(**kw) -> dict[str, str]:
    base = {"worker": WORKER_QUALNAME, "runner": "V1", "mode": "sync", "vLLM release": "0.32.0"}
    return {**base, **kw}


def test_a_runner_or_release_that_differs_is_named():
    v2 = verdict([_decision(), _decision(runner="Model Runner V2")])
    assert v2 is not None and "runner (rank 0: 'V1', rank 1: 'Model Runner V2')" in v2
    release = verdict([_decision(), _decision(**{"vLLM release": "0.33.0"})])
    assert release is not None and "vLLM release (rank 0: '0.32.0', rank 1: '0.33.0')" in release
    assert verdict([_decision(), _decision(platform="cuda")]) is None  # a setting alone


def test_the_release_is_compared_without_its_local_label(monkeypatch):
    """``0.32.0+cu128`` on one host and ``0.32.0`` on another are one release, in
    the deployment check and in the runner's start-up fingerprint."""
    import vllm

    from vllm_ppspec.patches.config.deployment_check import decision_of
    from vllm_ppspec.runner.health.startup_check import fingerprint

    monkeypatch.setattr(vllm, "__version__", "0.32.0+cu128")
    assert decision_of(_config(WORKER_QUALNAME), "sync")["vLLM release"] == "0.32.0"
    runner = SimpleNamespace(
        speculative_config=SimpleNamespace(
            method="draft_model", num_speculative_tokens=3, draft_model_config=None
        ),
        parallel_config=SimpleNamespace(pipeline_parallel_size=2),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
    )
    assert fingerprint(runner, "sync")["vLLM version"] == "0.32.0"
