"""PP ranks refuse to start when they were started differently
(``runner/health/startup_check.py``), on every rank, within seconds; a rank that never
reaches the check is named within the timeout; the protocol is compared first;
host-local settings may differ. Plain gloo ranks."""

from __future__ import annotations

import functools
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.distributed import run_ranks
from vllm_ppspec.protocol import PROTOCOL
from vllm_ppspec.protocol.agreement import host_label
from vllm_ppspec.runner.health.startup_check import (
    AGREED_SWITCHES,
    COMPARED_AS_FIELDS,
    HOST_LOCAL_SWITCHES,
    StartupMismatchError,
    agree,
    differences,
    fingerprint,
)

BASE = {"vLLM version": "0.33.0", "mode": "async lanes", "num_speculative_tokens": "3"}


def _agree_rank(
    changes: dict[int, dict[str, str]], absent: int | None, rank: int, world: int
) -> str:
    import torch.distributed as dist

    if rank == absent:
        time.sleep(8.0)  # never calls the check (a node without the plugin's worker)
        return "absent"
    mine = {**BASE, **changes.get(rank, {})}
    start = time.monotonic()
    try:
        agree(dist.group.WORLD, mine, timeout=3.0)
    except StartupMismatchError as e:
        return f"refused after {time.monotonic() - start:.1f} s: {e}"
    return "agreed"


def _agree(changes: dict[int, dict[str, str]], absent: int | None = None):
    return functools.partial(_agree_rank, changes, absent)


def test_equal_fingerprints_agree_on_every_rank():
    results = run_ranks(_agree({}), world=3, timeout=60)
    assert [r.value for r in results] == ["agreed"] * 3, [r.message for r in results]


def test_a_differing_field_is_refused_on_every_rank_naming_it_and_each_value():
    changes = {1: {"num_speculative_tokens": "4"}, 2: {"$VLLM_PPSPEC_ONE_BATCH": "1"}}
    results = run_ranks(_agree(changes), world=3, timeout=60)
    for r in results:
        assert r.error is None and str(r.value).startswith("refused"), (r.rank, r.message)
        msg = str(r.value)
        assert "num_speculative_tokens (rank 0: '3', rank 1: '4', rank 2: '3')" in msg, msg
        assert "$VLLM_PPSPEC_ONE_BATCH (rank 0: '<unset>'" in msg, msg
        assert "vLLM version" not in msg.split("Differs:")[1], msg  # equal fields not named
        assert float(msg.split()[2]) < 3.0, msg  # at once, not after the timeout


def test_a_rank_that_never_arrives_is_reported_within_the_timeout_by_the_others():
    results = run_ranks(_agree({}, absent=2), world=3, timeout=60)
    assert results[2].value == "absent"
    for r in results[:2]:
        msg = str(r.value)
        assert msg.startswith("refused"), (r.rank, r.message)
        assert "did not reach the plugin's start-up check within 3 s" in msg, msg
        assert "--worker-cls" in msg and "VLLM_PPSPEC_STARTUP_TIMEOUT" in msg, msg
        assert float(msg.split()[2]) < 3.0 + 5.0, msg
    assert "2" in str(results[0].value).split("(")[1], results[0].value  # rank 0 names it


def test_differences_lists_only_fields_that_differ():
    assert differences([BASE, dict(BASE)]) == []
    assert differences([BASE, {**BASE, "mode": "sync"}]) == [
        "mode (rank 0: 'async lanes', rank 1: 'sync')"
    ]


# ---------------------------------------------------------------------------
# fingerprint(): what it holds, and each field on real ranks
# ---------------------------------------------------------------------------


def _runner(
    method: str = "draft_model",
    k: int = 3,
    architectures: tuple[str, ...] = ("LlamaForCausalLM",),
    hidden_size: int = 64,
    pp: int = 2,
    max_num_seqs: int = 16,
) -> Any:
    """A stand-in for the plugin's runner: the attributes fingerprint() reads."""
    hf = SimpleNamespace(architectures=list(architectures), hidden_size=hidden_size)
    return SimpleNamespace(
        speculative_config=SimpleNamespace(
            method=method,
            num_speculative_tokens=k,
            draft_model_config=SimpleNamespace(hf_config=hf),
        ),
        parallel_config=SimpleNamespace(pipeline_parallel_size=pp),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
    )


def _plan(mode: str = "sync", runner: Any = None) -> Any:
    """The plan of a line the plugin serves in ``mode`` (a ``Mode`` value), its
    switches read from this process's environment as ``choice.plan.decide`` reads them."""
    from vllm_ppspec.choice.plan import Plan, with_switches
    from vllm_ppspec.choice.policy import Mode

    runner = runner or _runner()
    config = SimpleNamespace(
        speculative_config=runner.speculative_config,
        scheduler_config=SimpleNamespace(async_scheduling=mode == Mode.LANES.value),
        parallel_config=SimpleNamespace(data_parallel_size=1),
    )
    plan = Plan(worker=True, line=True, mode=Mode(mode), pp=2)
    return with_switches(plan, config)


def test_the_fingerprint_holds_exactly_what_must_agree(monkeypatch):
    import vllm

    from vllm_ppspec import protocol

    for name in [
        *AGREED_SWITCHES,
        *HOST_LOCAL_SWITCHES,
        *COMPARED_AS_FIELDS,
        "VLLM_PP_LAYER_PARTITION",
    ]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_PPSPEC_STARTUP_TIMEOUT", "5")  # host-local: not in it
    monkeypatch.setenv("VLLM_PPSPEC_DP_AGREE_TIMEOUT", "9")  # host-local: not in it
    assert protocol.PROTOCOL >= 2  # 1 was the all-reduce round, before the one-way one
    assert fingerprint(_runner(), _plan("async with lanes")) == {
        "protocol": str(protocol.PROTOCOL),
        "vLLM version": vllm.__version__,
        "mode": "async with lanes",
        "pipeline_parallel_size": "2",
        "speculative method": "draft_model",
        "num_speculative_tokens": "3",
        "draft architectures": "['LlamaForCausalLM']",
        "draft hidden_size": "64",
        "max_num_seqs": "16",
        "target layer split ($VLLM_PP_LAYER_PARTITION)": "vLLM's even split",
        "layer split rule ($VLLM_PPSPEC_LAYER_SPLIT)": "weights",  # unset: the default
        "drafter stage ($VLLM_PPSPEC_DRAFTER_STAGE)": "last",  # unset: the default
        "$VLLM_PPSPEC_ONE_BATCH": "0",  # unset: its default
        "$VLLM_PPSPEC_ADAPTIVE_K": "0",
        "host": host_label(),  # for the messages: never compared
    }


def test_every_vllm_ppspec_variable_in_the_source_is_classified_once():
    src = Path(__file__).resolve().parent.parent / "src"
    text = "\n".join(p.read_text() for p in src.rglob("*.py"))
    names = set(re.findall(r"VLLM_PPSPEC_[A-Z0-9_]*[A-Z0-9]", text))
    classes = [set(AGREED_SWITCHES), set(HOST_LOCAL_SWITCHES), set(COMPARED_AS_FIELDS)]
    assert sum(len(c) for c in classes) == len(set.union(*classes))  # each in one class
    assert names - set.union(*classes) == set()


# Rank 1's change per case; every other rank runs the stand-in unchanged, with
# no VLLM_PPSPEC_* variable set. "runner": _runner's arguments; "mode"; "env";
# "protocol", "vllm", "plugin": this rank's protocol number, vLLM version,
# vllm-ppspec version.
MUST_AGREE = {
    "protocol": {"protocol": 1},
    "vLLM version": {"vllm": "0.32.9"},
    "mode": {"mode": "async with lanes"},
    "pipeline_parallel_size": {"runner": {"pp": 3}},
    "speculative method": {"runner": {"method": "eagle"}},
    "num_speculative_tokens": {"runner": {"k": 4}},
    "draft architectures": {"runner": {"architectures": ("OtherForCausalLM",)}},
    "draft hidden_size": {"runner": {"hidden_size": 128}},
    "max_num_seqs": {"runner": {"max_num_seqs": 8}},
    # One host set the split (or the plugin chose another): the layers would not line up.
    "target layer split ($VLLM_PP_LAYER_PARTITION)": {"env": {"VLLM_PP_LAYER_PARTITION": "3,1"}},
    # One host runs the draft model on the first stage, the others on the last.
    "drafter stage ($VLLM_PPSPEC_DRAFTER_STAGE)": {"env": {"VLLM_PPSPEC_DRAFTER_STAGE": "first"}},
    # One host measures the split, the other takes the weights rule's.
    "layer split rule ($VLLM_PPSPEC_LAYER_SPLIT)": {"env": {"VLLM_PPSPEC_LAYER_SPLIT": "measured"}},
    "$VLLM_PPSPEC_ONE_BATCH": {"env": {"VLLM_PPSPEC_ONE_BATCH": "1"}},
    # Adaptive K on one host only: CUDA graphs captured piecewise there alone.
    "$VLLM_PPSPEC_ADAPTIVE_K": {"env": {"VLLM_PPSPEC_ADAPTIVE_K": "1"}},
}
HOST_LOCAL = {
    "VLLM_PPSPEC_STARTUP_TIMEOUT": "5",
    "VLLM_PPSPEC_DP_AGREE_TIMEOUT": "7",
    "VLLM_PPSPEC_PEER_KEEPALIVE_S": "20",
    "VLLM_PPSPEC_AUTO": "0",
    "VLLM_PPSPEC_CPU_COMPILED_CORRECTION": "1",
    "VLLM_PPSPEC_FAULT": "raise@3",
    "VLLM_PPSPEC_FAULT_SKIP_ACCEPTED_COUNTS": "1",
    "VLLM_PPSPEC_HOME": "/srv/ppspec",
    "VLLM_PPSPEC_CACHE": "/srv/ppspec-cache",
    "VLLM_PPSPEC_ADAPTIVE_K_BATCHES": "50",
}
AGREEING = {
    **{f"${name}": {"env": {name: value}} for name, value in HOST_LOCAL.items()},
    # Each agreed switch set to its default on one rank, unset on the others.
    **{f"{name}={d}": {"env": {name: d}} for name, d in AGREED_SWITCHES.items()},
    # A value the plugin reads as the default (it acts only on the other one).
    "VLLM_PPSPEC_ONE_BATCH=yes": {"env": {"VLLM_PPSPEC_ONE_BATCH": "yes"}},
    # Asked for on one host where it cannot run (eagle3): every rank decides "last".
    "$VLLM_PPSPEC_DRAFTER_STAGE where it cannot move": {
        "env": {"VLLM_PPSPEC_DRAFTER_STAGE": "first"},
        "runner": {"method": "eagle3"},
        "all": True,
    },
    # The rule set to its default on one host.
    "VLLM_PPSPEC_LAYER_SPLIT=weights": {"env": {"VLLM_PPSPEC_LAYER_SPLIT": "weights"}},
    # Another build of the plugin that speaks the same protocol.
    "vllm-ppspec version": {"plugin": "0.2.0"},
}
PROTOCOL_AND_K = {"protocol": 1, "runner": {"k": 4}, "env": {"VLLM_PPSPEC_ONE_BATCH": "1"}}


def _fingerprint_as(change: dict[str, Any]) -> dict[str, str]:
    """This rank's fingerprint of the stand-in runner with ``change`` applied."""
    import vllm

    import vllm_ppspec
    from vllm_ppspec import protocol

    for name in [
        *AGREED_SWITCHES,
        *HOST_LOCAL_SWITCHES,
        *COMPARED_AS_FIELDS,
        "VLLM_PP_LAYER_PARTITION",
    ]:
        os.environ.pop(name, None)
    os.environ.update(change.get("env", {}))
    saved = protocol.PROTOCOL, vllm.__version__, vllm_ppspec.__version__
    protocol.PROTOCOL = change.get("protocol", protocol.PROTOCOL)
    vllm.__version__ = change.get("vllm", vllm.__version__)
    vllm_ppspec.__version__ = change.get("plugin", vllm_ppspec.__version__)
    try:
        runner = _runner(**change.get("runner", {}))
        return fingerprint(runner, _plan(change.get("mode", "sync"), runner))
    finally:
        protocol.PROTOCOL, vllm.__version__, vllm_ppspec.__version__ = saved


def _cases_rank(cases: dict[str, dict[str, Any]], rank: int, world: int) -> dict[str, str]:
    """Every case in turn on the same group: rank 1 changed, the check run."""
    import torch.distributed as dist

    outcomes = {}
    for case, change in cases.items():
        try:
            # Rank 1 changed; "all": the runner's change on every rank, the env on rank 1.
            mine = change if rank == 1 else {}
            if change.get("all") and rank != 1:
                mine = {"runner": change["runner"]}
            agree(dist.group.WORLD, _fingerprint_as(mine), timeout=20.0)
            outcomes[case] = "agreed"
        except StartupMismatchError as e:
            outcomes[case] = f"refused: {e}"
    return outcomes


@pytest.fixture(scope="module")
def outcomes() -> list[dict[str, str]]:
    """Each rank's outcome of every case, from one run of three gloo ranks."""
    cases = {**MUST_AGREE, **AGREEING, "protocol and k": PROTOCOL_AND_K}
    results = run_ranks(functools.partial(_cases_rank, cases), world=3, timeout=120)
    assert all(r.error is None for r in results), [r.message for r in results]
    return [r.value for r in results]


def _named(msg: str) -> list[str]:
    """The fields an error names as differing."""
    return [line.split(" (rank 0: ")[0] for line in msg.split("Differs: ")[1].split("; ")]


def test_the_cases_cover_every_field_and_host_local_setting():
    assert set(MUST_AGREE) | {"host"} == set(fingerprint(_runner(), _plan()))
    assert set(HOST_LOCAL) == set(HOST_LOCAL_SWITCHES)


@pytest.mark.parametrize("field", sorted(MUST_AGREE))
def test_a_field_that_must_agree_is_refused_naming_it_on_every_rank(outcomes, field):
    for rank, outcome in enumerate(outcomes):
        msg = outcome[field]
        assert msg.startswith("refused"), (rank, msg)
        assert _named(msg) == [field], (rank, msg)
        assert f"{field} (rank 0: " in msg and ", rank 2: " in msg, (rank, msg)
        # Where each rank runs: its host, never compared (all three on this one).
        host = host_label()
        assert msg.endswith(f"Hosts: rank 0: {host}, rank 1: {host}, rank 2: {host}"), msg


@pytest.mark.parametrize("case", sorted(AGREEING))
def test_host_local_settings_defaults_and_the_plugin_version_may_differ(outcomes, case):
    assert [o[case] for o in outcomes] == ["agreed"] * 3, [o[case] for o in outcomes]


def test_the_protocol_is_checked_first_and_named_alone(outcomes):
    for rank, outcome in enumerate(outcomes):
        msg = outcome["protocol and k"]
        assert "different versions of the plugin's protocol" in msg, (rank, msg)
        assert _named(msg) == ["protocol"], (rank, msg)
        mine = PROTOCOL
        assert f"protocol (rank 0: '{mine}', rank 1: '1', rank 2: '{mine}')" in msg, (rank, msg)
