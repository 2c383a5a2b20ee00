"""An error on a non-last PP rank ends the engine (runner/health/rank_errors.py), through vLLM's
own mp executor, which reads only the last rank's replies.

Faults are injected on the non-last rank with ``VLLM_PPSPEC_FAULT``
(protocol/faults.py): a missing stash (async: the round cannot be applied), an
exception while applying a round (async), and an exception in
``execute_model`` (sync and async). Before runner/health/rank_errors.py the
first was logged on that rank and generation completed normally, the round's
state update skipped in silence. Each job must fail, within a bound, with the
error named in the log.
"""

from __future__ import annotations

import time

import pytest

from tests.engine_jobs import job, run_job

pytestmark = pytest.mark.e2e

BOUND_S = 240  # engine start-up (about 30 s here) + failing + shutting down


# How vLLM starts its engine core and workers: "spawn" as for a user (fresh
# interpreters that load the plugin themselves: about 25 s more per start-up
# here), "fork" from the test's fork server (fixtures/forkserver.py). A fault
# reaches the engine the same way either way; one case runs as a user's.
START = {
    ("drop_rows@4", "async"): "fork",
    ("raise@4", "sync"): "spawn",
    ("raise@4", "async"): "fork",
    ("raise_in_round@4", "async"): "fork",
}


@pytest.mark.parametrize(
    "fault,mode,error",
    [
        ("drop_rows@4", "async", "MissingRowsError"),
        ("raise@4", "sync", "InjectedFault"),
        ("raise@4", "async", "InjectedFault"),
        ("raise_in_round@4", "async", "InjectedFault"),
    ],
)
def test_error_on_a_non_last_rank_ends_the_engine(models, fault, mode, error):
    spec = {"method": "draft_model", "model": models["draft_copy"], "num_speculative_tokens": 3}
    t0 = time.monotonic()
    res = run_job(
        job(
            models["target"],
            pp=2,
            spec=spec,
            async_scheduling=(mode == "async"),
            env={"VLLM_PPSPEC_FAULT": fault, "PPSPEC_VLLM_START": START[fault, mode]},
            # as a user runs it: the engine core in a process of its own
            engine_core="process",
        ),
        timeout=BOUND_S,
    )
    elapsed = time.monotonic() - t0
    assert "TIMEOUT" not in res.log, res.log[-4000:]
    assert res.returncode != 0, "generation completed despite the fault:\n" + res.log[-4000:]
    assert error in res.log, res.log[-6000:]
    assert "ending this worker so that vLLM stops the engine" in res.log, res.log[-6000:]
    assert res.result is None  # no outputs were written
    print(f"{fault} {mode}: engine stopped, job ended after {elapsed:.0f}s")
