"""rank_errors.RankErrorsEndEngine and faults.Faults, without an engine."""

from __future__ import annotations

import pytest

from vllm_ppspec.protocol import faults
from vllm_ppspec.protocol.rounds import RoundDivergenceError
from vllm_ppspec.runner import rank_errors


class _Base:
    def __init__(self, error: Exception | None):
        self.error = error

    def execute_model(self, *args):
        if self.error:
            raise self.error
        return "output"

    def sample_tokens(self, *args):
        if self.error:
            raise self.error
        return "sampled"


class _Worker(rank_errors.RankErrorsEndEngine, _Base):
    def __init__(self, error: Exception | None, active: bool = True):
        super().__init__(error)
        self.model_runner = type("R", (), {"ppspec_active": active})()


@pytest.fixture
def ended(monkeypatch):
    calls: list[str] = []

    def end_worker(error, what):
        calls.append(f"{what.split()[0]}: {error}")
        raise SystemExit(rank_errors.EXIT_CODE)  # stands in for os._exit

    monkeypatch.setattr(rank_errors, "end_worker", end_worker)
    return calls


def _output_rank(monkeypatch, yes: bool) -> None:
    monkeypatch.setattr(rank_errors, "is_output_rank", lambda: yes)


@pytest.mark.parametrize("call", ["execute_model", "sample_tokens"])
def test_an_error_on_a_rank_vllm_does_not_read_ends_the_worker(monkeypatch, ended, call):
    _output_rank(monkeypatch, False)
    with pytest.raises(SystemExit):
        getattr(_Worker(RuntimeError("boom")), call)()
    assert ended == [f"{call}: boom"]


def test_the_output_rank_raises_as_vllm_expects(monkeypatch, ended):
    _output_rank(monkeypatch, True)
    with pytest.raises(RuntimeError, match="boom"):
        _Worker(RuntimeError("boom")).execute_model()
    assert ended == []


def test_errors_every_rank_raises_are_left_to_the_output_rank(monkeypatch, ended):
    _output_rank(monkeypatch, False)
    with pytest.raises(RoundDivergenceError):
        _Worker(RoundDivergenceError("rows differ")).sample_tokens()
    assert ended == []


def test_without_the_plugin_active_vllm_behaviour_is_kept(monkeypatch, ended):
    _output_rank(monkeypatch, False)
    with pytest.raises(RuntimeError):
        _Worker(RuntimeError("boom"), active=False).execute_model()
    assert ended == []
    assert _Worker(None).execute_model() == "output"


def test_fault_switches_parse_once_and_refuse_bad_values(monkeypatch):
    monkeypatch.setenv(faults.FAULT, "drop_stash@3")
    f = faults.Faults.from_env()
    assert f.fires("drop_stash", 3) and not f.fires("drop_stash", 2) and not f.fires("raise", 3)
    assert f.any() and not faults.Faults().any()
    for bad in ("drop_stash", "explode@1", "raise@0", "raise@x"):
        monkeypatch.setenv(faults.FAULT, bad)
        with pytest.raises(ValueError, match="VLLM_PPSPEC_FAULT"):
            faults.Faults.from_env()


def test_a_dead_pp_peer_ends_the_worker(monkeypatch):
    import os
    import subprocess
    import sys
    import threading

    import torch.distributed as dist

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is gone (reaped)
    monkeypatch.setattr(dist, "get_world_size", lambda group: 2)

    def all_gather_object(out, obj, group):
        out[:] = [obj, dead.pid]

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    ended = threading.Event()
    seen: list[str] = []

    def end_worker(error, what):
        seen.append(f"{what}: {error}")
        ended.set()

    monkeypatch.setattr(rank_errors, "end_worker", end_worker)
    assert rank_errors.watch_pp_peers(None, interval_s=0.01) == [dead.pid]
    assert ended.wait(5), "the watcher did not notice the dead peer"
    assert seen[0] == f"a PP peer died: process {dead.pid} is gone"
    assert rank_errors._alive(os.getpid())
