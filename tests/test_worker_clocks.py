"""The plugin's workers report their runner's clocks by name, for vLLM's
``collective_rpc`` (what scripts/bench_two_hosts.py reads through a server)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vllm_ppspec.protocol.rounds import Round
from vllm_ppspec.runner.clocks import Clocks, WorkerClocks


def test_a_worker_reports_its_runners_clocks_and_nothing_without_them():
    clocks = Clocks()
    with clocks.timing("wait_s"):
        pass
    clocks.steps, clocks.forward_s, clocks.total_step_s = 4, 0.5, 2.0
    empty = torch.zeros((0, 1), dtype=torch.int32)
    clocks.received(Round(empty, empty, travel_wait_s=0.25))
    clocks.received(Round(empty, empty, travel_wait_s=0.5))
    worker = WorkerClocks()
    worker.model_runner = SimpleNamespace(ppspec_clocks=clocks)
    got = worker.ppspec_clocks()
    assert got["steps"] == 4.0 and got["forward_s"] == 0.5
    assert got["wait_s"] > 0.0 and got["step_s"] == 2.0 - got["wait_s"]
    assert got["rounds"] == 2.0 and got["travel_wait_s"] == 0.75
    worker.model_runner = SimpleNamespace()
    assert worker.ppspec_clocks() == {}


def test_both_plugin_workers_have_it():
    from vllm_ppspec.workers.cpu import PPSpecCPUWorker
    from vllm_ppspec.workers.gpu import PPSpecGPUWorker

    assert issubclass(PPSpecCPUWorker, WorkerClocks) and issubclass(PPSpecGPUWorker, WorkerClocks)
