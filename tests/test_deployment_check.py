"""Every rank of a line the plugin serves decided the same (``choice/deployment.py``).

Each case runs the check as vLLM's workers do: right after vLLM's
``initialize_model_parallel`` (the wrapper the config patches install), on
plain gloo ranks with vLLM's groups, the current config a stand-in:

* a rank that decided otherwise (another worker) is refused on every rank
  within seconds, naming the setting and its host; the rank that decided
  otherwise does not wait, and is ended by its watch;
* a rank without the plugin, or without a speculative config (both post
  nothing), is named after ``VLLM_PPSPEC_STARTUP_TIMEOUT``;
* a line where no rank can act (no speculative config; PP = 1 and DP = 1)
  posts nothing and starts no thread;
* a line where the plugin does not act (vLLM's Model Runner V2 picked) starts
  at once, also beside a rank without the plugin;
* the same decision from different settings agrees; vLLM's release is
  compared without its local label.

The two-host case is in tests/test_e2e_two_hosts.py.
"""

from __future__ import annotations

import functools
import os
import time
from types import SimpleNamespace

from tests.distributed import run_ranks
from vllm_ppspec import WORKER_QUALNAME
from vllm_ppspec.choice.deployment import DeploymentMismatchError, verdict
from vllm_ppspec.choice.plan import OFF

CPU_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"
NO_PLUGIN = "no plugin"  # a rank that never runs the check (vllm-ppspec not installed)


def _config(worker: str, v2: bool = False, spec: bool = True, pp: int = 2) -> SimpleNamespace:
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            worker_cls=worker, pipeline_parallel_size=pp, data_parallel_size=1, nnodes=1
        ),
        speculative_config=SimpleNamespace(method="draft_model") if spec else None,
        scheduler_config=SimpleNamespace(async_scheduling=False),
        model_config=SimpleNamespace(is_moe=False),
        use_v2_model_runner=v2,
    )


def _rank(per_rank: dict, hold_s: float, rank: int, world: int) -> str:
    """One rank: the check as vLLM's workers run it. Returns what happened."""
    import threading

    import vllm.config

    from vllm_ppspec.choice import deployment
    from vllm_ppspec.patches.config import deployment_check
    from vllm_ppspec.protocol import decision_board

    cfg, env = per_rank[rank]
    if cfg == NO_PLUGIN:
        time.sleep(hold_s)  # alive (rank 0 holds the store), but never posts
        return "no plugin"
    os.environ.update(env)
    ended: list[str] = []
    deployment.end_process = ended.append  # the watch's end, recorded
    vllm.config.get_current_vllm_config_or_none = lambda: cfg
    threads = set(threading.enumerate())
    start = time.monotonic()
    try:
        deployment_check._wrap(lambda: None)()
    except DeploymentMismatchError as e:
        return f"refused after {time.monotonic() - start:.1f} s: {e}"
    started = time.monotonic() - start
    new_threads = sorted(t.name for t in set(threading.enumerate()) - threads)
    posted = decision_board.board(decision_board.default_store()).check([f"decision/{rank}"])
    if env.get("REPORT_BOARD"):
        time.sleep(hold_s)  # rank 0 holds the store until every rank has read it
        return f"posted {posted}; new threads {new_threads}"
    while not ended and time.monotonic() - start < hold_s:
        time.sleep(0.05)
    if ended:
        ended_s = time.monotonic() - start
        return f"started after {started:.1f} s; ended after {ended_s:.1f} s: {ended[0]}"
    return f"started after {started:.1f} s"


def _run(per_rank: dict, hold_s: float = 8.0, timeout_s: str = "60") -> list:
    os.environ["VLLM_PPSPEC_STARTUP_TIMEOUT"] = timeout_s
    try:
        return run_ranks(
            functools.partial(_rank, per_rank, hold_s),
            world=len(per_rank),
            timeout=90,
            vllm_groups=True,
        )
    finally:
        del os.environ["VLLM_PPSPEC_STARTUP_TIMEOUT"]


def _seconds(msg: str, word: str) -> float:
    return float(msg.split(f"{word} after ")[1].split()[0])


def test_a_host_that_decided_otherwise_is_refused_on_every_rank_naming_host_and_setting():
    per_rank = {
        0: (_config(WORKER_QUALNAME), {}),
        1: (_config(CPU_WORKER), {"VLLM_PPSPEC_AUTO": "0"}),
    }
    r0, r1 = _run(per_rank)
    assert r0.error is None and r1.error is None, (r0.message, r1.message)
    for msg in (r0.value, r1.value):
        assert "decided differently who serves" in msg, msg
        assert f"worker (rank 0: '{WORKER_QUALNAME}', rank 1: '{CPU_WORKER}')" in msg, msg
        assert "mode (rank 0: 'sync', rank 1: 'off')" in msg, msg
        assert "$VLLM_PPSPEC_AUTO (rank 0: '<unset>', rank 1: '0')" in msg, msg
        assert "Decided otherwise: rank 1 on host " in msg, msg
        assert "not installed" not in msg, msg
    assert r0.value.startswith("refused") and _seconds(r0.value, "refused") < 10.0, r0.value
    # The rank that decided otherwise did not wait, and its watch ended it.
    assert _seconds(r1.value, "started") < 1.0 and _seconds(r1.value, "ended") < 10.0, r1.value


def test_a_host_with_no_spec_config_posts_nothing_and_is_named_after_the_timeout():
    """No speculative config: no rank of that line could act, so it posts
    nothing; the rank that acts names it after the start-up timeout."""
    per_rank = {
        0: (_config(WORKER_QUALNAME), {}),
        1: (_config(CPU_WORKER, spec=False), {"REPORT_BOARD": "1"}),
    }
    r0, r1 = _run(per_rank, hold_s=2.0, timeout_s="3")
    assert r1.value == "posted False; new threads []", r1.value
    msg = str(r0.value)
    assert msg.startswith("refused") and 3.0 <= _seconds(msg, "refused") < 8.0, r0
    assert "rank 1 posted no decision within 3 s" in msg, msg
    assert "started without --speculative-config" in msg, msg


def test_where_no_rank_can_act_nothing_is_posted_and_no_thread_starts():
    """The plugin installed, TP=2 (PP = 1, DP = 1, spec or not) or PP=2 without
    spec: no store key, no watch thread, on every rank."""
    for cfg in (_config(CPU_WORKER, pp=1), _config(CPU_WORKER, spec=False)):
        per_rank = {r: (cfg, {"REPORT_BOARD": "1"}) for r in (0, 1)}
        results = _run(per_rank, hold_s=2.0)
        assert [r.value for r in results] == ["posted False; new threads []"] * 2, results


def test_a_line_the_plugin_serves_posts_and_a_rank_that_does_not_act_watches():
    """The counterpart of the case above: where a rank could act the check posts,
    and a rank that does not act (vLLM's own worker) starts the watch thread."""
    per_rank = {r: (_config(CPU_WORKER), {"REPORT_BOARD": "1"}) for r in (0, 1)}
    results = _run(per_rank, hold_s=2.0)
    expected = "posted True; new threads ['ppspec-deployment-watch']"
    assert [r.value for r in results] == [expected] * 2, results


def test_a_host_without_the_plugin_is_named_after_the_timeout_as_such():
    per_rank = {0: (_config(WORKER_QUALNAME), {}), 1: (NO_PLUGIN, {})}
    r0, _ = _run(per_rank, hold_s=10.0, timeout_s="3")
    msg = str(r0.value)
    assert msg.startswith("refused"), r0
    assert 3.0 <= _seconds(msg, "refused") < 8.0, msg
    assert "rank 1 posted no decision within 3 s" in msg, msg
    assert "vllm-ppspec is not installed on that host" in msg, msg


def test_a_line_vllms_v2_serves_starts_at_once_beside_a_host_without_the_plugin():
    """vLLM picked Model Runner V2 where the plugin is installed: nothing
    waits and nothing is refused (the plugin would change nothing there)."""
    per_rank = {0: (_config(CPU_WORKER, v2=True), {}), 1: (NO_PLUGIN, {})}
    r0, _ = _run(per_rank, hold_s=6.0, timeout_s="3")
    assert r0.error is None and r0.value.startswith("started after"), r0
    assert _seconds(r0.value, "started") < 1.0 and "ended" not in r0.value, r0.value


def test_the_same_decision_from_different_settings_agrees():
    per_rank = {
        0: (_config(WORKER_QUALNAME), {"VLLM_PPSPEC_AUTO": "1"}),
        1: (_config(WORKER_QUALNAME), {"VLLM_PPSPEC_AUTO": "yes"}),
    }
    # Both ranks stay up 2 s after starting (rank 0 holds the store that rank
    # 1 still reads while its check ends).
    results = _run(per_rank, hold_s=2.0)
    assert all(r.error is None and not r.hung for r in results), results
    assert [r.value.split(" after ")[0] for r in results] == ["started", "started"], results
    assert not any("ended" in r.value for r in results), results


def _decision(**kw) -> dict[str, str]:
    base = {"worker": WORKER_QUALNAME, "runner": "V1", "mode": "sync", "vLLM release": "0.32.0"}
    return {**base, **kw}


def test_a_runner_or_release_that_differs_is_named():
    v2 = verdict({0: _decision(), 1: _decision(runner="Model Runner V2")})
    assert v2 is not None and "runner (rank 0: 'V1', rank 1: 'Model Runner V2')" in v2
    release = verdict({0: _decision(), 1: _decision(**{"vLLM release": "0.33.0"})})
    assert release is not None and "vLLM release (rank 0: '0.32.0', rank 1: '0.33.0')" in release
    assert verdict({0: _decision(), 1: _decision(platform="cuda")}) is None  # a setting alone


def test_the_release_is_compared_without_its_local_label(monkeypatch):
    """``0.32.0+cu128`` on one host and ``0.32.0`` on another are one release, in
    the deployment check and in the runner's start-up fingerprint."""
    import vllm

    from vllm_ppspec.choice.deployment import decision_of
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
    assert fingerprint(runner, OFF)["vLLM version"] == "0.32.0"
