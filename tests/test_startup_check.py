"""PP ranks refuse to start when they were started differently
(``runner/startup_check.py``), on every rank, within seconds; a rank that never
reaches the check is named within the timeout. Plain gloo ranks."""

from __future__ import annotations

import functools
import time

from tests.distributed import run_ranks
from vllm_ppspec.runner.startup_check import StartupMismatchError, agree, differences

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
    changes = {1: {"num_speculative_tokens": "4"}, 2: {"$VLLM_PPSPEC_ASYNC_LANES": "0"}}
    results = run_ranks(_agree(changes), world=3, timeout=60)
    for r in results:
        assert r.error is None and str(r.value).startswith("refused"), (r.rank, r.message)
        msg = str(r.value)
        assert "num_speculative_tokens (rank 0: '3', rank 1: '4', rank 2: '3')" in msg, msg
        assert "$VLLM_PPSPEC_ASYNC_LANES (rank 0: '<unset>'" in msg, msg
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
