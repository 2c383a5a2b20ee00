"""rank_errors.RankErrorsEndEngine and faults.Faults, without an engine."""

from __future__ import annotations

import os

import pytest

from vllm_ppspec.choice.plan import Plan
from vllm_ppspec.choice.policy import Mode
from vllm_ppspec.protocol import faults
from vllm_ppspec.protocol.rounds import RoundDivergenceError
from vllm_ppspec.runner.health import rank_errors


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
        plan = Plan(worker=True, line=True, mode=Mode.SYNC if active else Mode.OFF, pp=2)
        self.model_runner = type("R", (), {"ppspec_plan": plan})()


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
        _Worker(RoundDivergenceError("rows differ", every_rank=True)).sample_tokens()
    assert ended == []


def test_a_divergence_only_this_receiver_sees_ends_its_worker(monkeypatch, ended):
    # The last rank cannot know (rounds go one way): left to the output rank,
    # nobody would report it and the engine would carry on without this rank.
    _output_rank(monkeypatch, False)
    with pytest.raises(SystemExit):
        _Worker(RoundDivergenceError("rows differ", every_rank=False)).sample_tokens()
    assert ended == ["sample_tokens: rows differ"]


def test_without_the_plugin_active_vllm_behaviour_is_kept(monkeypatch, ended):
    _output_rank(monkeypatch, False)
    with pytest.raises(RuntimeError):
        _Worker(RuntimeError("boom"), active=False).execute_model()
    assert ended == []
    assert _Worker(None).execute_model() == "output"


def test_fault_switches_parse_once_and_refuse_bad_values(monkeypatch):
    monkeypatch.setenv(faults.FAULT, "drop_rows@3")
    f = faults.Faults.from_env()
    assert f.fires("drop_rows", 3) and not f.fires("drop_rows", 2) and not f.fires("raise", 3)
    assert f.any() and not faults.Faults().any()
    for bad in ("drop_rows", "explode@1", "raise@0", "raise@x"):
        monkeypatch.setenv(faults.FAULT, bad)
        with pytest.raises(ValueError, match="VLLM_PPSPEC_FAULT"):
            faults.Faults.from_env()


def _survive_a_killed_peer(rank: int, world: int):
    """Every rank connects to its peers; the last is then SIGKILLed; the others
    must see exactly that rank gone, within seconds."""
    import signal
    import time

    import torch.distributed as dist

    from vllm_ppspec.runner.health.peer_links import connect_peers
    from vllm_ppspec.runner.health.peer_watch import first_gone

    group = dist.new_group(backend="gloo")
    peers = connect_peers(group, "127.0.0.1")
    assert sorted(peers) == [r for r in range(world) if r != rank]
    dist.barrier(group=group)
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    gone, seen = first_gone(peers)
    seconds = time.monotonic() - t0
    time.sleep(2)  # stay up: the other survivor must see the killed rank, not this one
    return gone, seen, seconds


def test_a_killed_pp_peer_is_seen_gone_by_every_other_rank_within_seconds():
    from tests.distributed import run_ranks

    results = run_ranks(_survive_a_killed_peer, world=3, timeout=60)
    assert results[2].hung and results[2].exitcode == -9  # SIGKILLed, never reported
    for r in results[:2]:
        assert r.error is None and not r.hung, r.message
        gone, seen, seconds = r.value
        assert gone == 2 and seen == "its connection closed", r.value
        assert seconds < 5, r.value


def test_the_watcher_ends_the_worker_and_uses_no_process_ids(monkeypatch):
    """watch_pp_peers: the thread calls end_worker when a peer's connection ends.
    The peers here are two sockets of this process: no pid could tell them apart."""
    import socket
    import threading

    from vllm_ppspec.runner.health import peer_links, peer_watch

    ours, theirs = socket.socketpair()
    peers = peer_links.Peers(0, {1: ours}, frozenset())
    monkeypatch.setattr(peer_watch, "connect_peers", lambda group, host: peers)
    monkeypatch.setattr(os, "kill", lambda *a: pytest.fail("the watcher used a pid"))
    ended = threading.Event()
    seen: list[str] = []

    def end_worker(error, what):
        seen.append(f"{what}: {error}")
        ended.set()

    monkeypatch.setattr(rank_errors, "end_worker", end_worker)
    assert peer_watch.watch_pp_peers(None, "127.0.0.1") == [1]
    assert not ended.wait(0.3), "ended while the peer was alive"
    theirs.close()  # what the kernel does when the peer process ends
    assert ended.wait(5), "the watcher did not notice the dead peer"
    assert seen == ["a PP peer died: PP rank 1: its connection closed"]


def test_the_end_of_a_worker_is_logged_through_vllm_s_handler():
    """An ERROR line with its traceback, in vLLM's format (the stop tests and
    users grep for ERROR)."""
    import logging

    assert rank_errors.logger.name.startswith("vllm.")
    assert logging.getLogger("vllm") in _ancestors(rank_errors.logger)


def _ancestors(logger):
    while logger is not None:
        yield logger
        logger = logger.parent


def test_a_worker_of_vllms_mp_executor_leaves_sigint_to_its_executor():
    """runner/health/orderly_stop.leave_sigint_to_the_executor: only a process
    whose SIGINT handler is vLLM's worker_main's ignores SIGINT afterwards."""
    import signal

    from vllm_ppspec.runner.health.orderly_stop import leave_sigint_to_the_executor

    def worker_main():
        def signal_handler(signum, frame):
            raise SystemExit()

        return signal_handler

    saved = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert leave_sigint_to_the_executor() is False  # not a worker: unchanged
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, worker_main())
        assert leave_sigint_to_the_executor() is True
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, saved)
