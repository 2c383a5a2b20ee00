"""A stop at vLLM's default ``--shutdown-timeout 0`` of a pipeline across nodes
gives the engine core a window to stop its workers in order
(``patches/config/stop_grace.py``); everywhere else vLLM's window stands.

Configs are real ``VllmConfig`` objects through ``EngineArgs`` (no engine);
the window is read through vLLM's own ``get_engine_process_shutdown_timeout``,
as ``CoreEngineProcManager.shutdown`` calls it. The stop itself is
``tests/test_e2e_two_hosts.py::test_an_orderly_stop_of_the_leader_ends_both_hosts_quietly``.
"""

from __future__ import annotations

import pytest

from vllm_ppspec.patches.config import stop_grace
from vllm_ppspec.plugin import register

register()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(stop_grace, "across_nodes", False)
    monkeypatch.delenv("VLLM_PPSPEC_AUTO", raising=False)
    monkeypatch.delenv("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", raising=False)


def _build(models, nnodes: int, spec: bool = True, pp: int = 2, dp: int = 1) -> None:
    from vllm.engine.arg_utils import EngineArgs

    draft = {
        "method": "draft_model",
        "num_speculative_tokens": 3,
        "model": models["draft_copy"],
        "max_model_len": 64,
    }
    EngineArgs(
        model=models["target"],
        dtype="float32",
        max_model_len=256,
        pipeline_parallel_size=pp,
        nnodes=nnodes,
        node_rank=0,
        data_parallel_size=dp,
        data_parallel_size_local=1,
        master_addr="127.0.0.1",
        distributed_executor_backend="mp",
        speculative_config=draft if spec else None,
    ).create_engine_config()


def _window(request_timeout, process_timeout):
    import vllm.v1.engine.utils as engine_utils

    return engine_utils.get_engine_process_shutdown_timeout(request_timeout, process_timeout)


def test_across_nodes_with_the_plugin_a_stop_at_timeout_0_gets_vllms_window(models):
    _build(models, nnodes=2)
    assert _window(0, 0) == 5.0  # VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS' default


def test_the_window_is_vllms_variable(models, monkeypatch):
    monkeypatch.setenv("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "9")
    _build(models, nnodes=2)
    assert _window(0, 0) == 9.0


def test_a_drain_timeout_and_other_windows_stay_vllms(models):
    _build(models, nnodes=2)
    assert _window(10, 10) == 10  # --shutdown-timeout 10: the drain's deadline
    assert _window(10, 0) == 0  # an outer manager's spent budget stays spent
    assert _window(0, None) is None  # vLLM's best-effort default (5 s)


@pytest.mark.parametrize(
    ("case", "nnodes", "spec", "pp", "auto", "dp"),
    [
        ("one node", 1, True, 2, None, 1),
        ("no speculative decoding", 2, False, 2, None, 1),
        ("vLLM's own worker", 2, True, 2, "0", 1),
        # --nnodes 2 with each DP replica's pipeline on its own node: no pipeline crosses hosts
        ("each DP replica on its own node", 2, True, 2, None, 2),
    ],
)
def test_elsewhere_a_stop_at_timeout_0_is_vllms(
    models, monkeypatch, case, nnodes, spec, pp, auto, dp
):
    if auto is not None:
        monkeypatch.setenv("VLLM_PPSPEC_AUTO", auto)
    _build(models, nnodes=nnodes, spec=spec, pp=pp, dp=dp)
    assert _window(0, 0) == 0, case


def test_a_window_vllm_gives_itself_is_kept(monkeypatch):
    monkeypatch.setattr(stop_grace, "across_nodes", True)
    assert stop_grace.window(0, 0, 15.0) == 15.0  # ROCm's
    assert stop_grace.window(0, 0, 0) == 5.0
